//! Joining a request's spans (`requests.py`'s `Joined`, `_TraceIndex`, `_containing_siblings`,
//! `_split`, `join_engine`, `join_ancestors`): which gateways stand in front of a request, which
//! client called it, and where a missing model or operation is looked for. Spans are their slots
//! in the trace (`TraceData`'s arrival order, Python's `trace.spans` order).

use std::collections::{HashMap, HashSet};

use crate::model::{SpanId, SPAN_KIND_SERVER};

use super::TraceView;

/// `requests.SIBLING_SKEW_NS`, `_MAX_BELOW`, `_MAX_SIBLINGS`.
const SIBLING_SKEW_NS: i128 = 5_000_000;
const MAX_BELOW: usize = 64;
const MAX_SIBLINGS: usize = 4;

/// `requests.Joined`: `lookup`, where a missing model, operation or dimension is looked for,
/// nearest first; `servers`, the gateways in front (nearest first); `client`, the outermost client
/// GenAI span of the call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Joined {
    pub lookup: Vec<usize>,
    pub servers: Vec<usize>,
    pub client: Option<usize>,
}

/// `requests._TraceIndex`: what the joins ask of the trace's spans by parent (`TraceView::children`),
/// memoised, made once per trace and only where a join needs it.
#[derive(Default)]
pub(super) struct TraceIndex {
    below: HashMap<usize, Vec<usize>>,
    candidates: HashMap<SpanId, Vec<usize>>,
}

impl TraceIndex {

    /// `_TraceIndex.genai_below`: GenAI spans under `top`, breadth first, among its first
    /// `MAX_BELOW` descendants (counted with repeats: a cycle ends there too).
    pub(super) fn genai_below(&mut self, t: &TraceView<'_>, top: usize) -> &[usize] {
        self.below.entry(top).or_insert_with(|| {
            let mut found = Vec::new();
            let mut frontier = vec![top];
            let mut seen = 0;
            'levels: while !frontier.is_empty() && seen < MAX_BELOW {
                let mut next = Vec::new();
                for &span in &frontier {
                    for &child in t.children(&t.data.span(span).span_id) {
                        seen += 1;
                        if seen > MAX_BELOW {
                            // Python breaks this span's loop; every later one breaks at its first child.
                            break 'levels;
                        }
                        if t.is_genai(child) {
                            found.push(child);
                        }
                        next.push(child);
                    }
                }
                frontier = next;
            }
            found
        })
    }

    /// `_TraceIndex.sibling_candidates`: the children of `parent` a forwarded traceparent can make
    /// an engine's gateway (SERVER spans no adapter claimed, and GenAI spans), shortest first.
    fn sibling_candidates(&mut self, t: &TraceView<'_>, parent: &SpanId) -> &[usize] {
        self.candidates.entry(*parent).or_insert_with(|| {
            let mut found: Vec<usize> = t.children(parent).iter().copied()
                .filter(|&span| (t.data.span(span).kind == SPAN_KIND_SERVER && t.data.obs(span).is_none())
                    || t.is_genai(span))
                .collect();
            found.sort_by_key(|&span| {
                let slot = t.data.span(span);
                i128::from(slot.end_unix_ns) - i128::from(slot.start_unix_ns)
            });
            found
        })
    }

    /// `requests._containing_siblings`: gateway or GenAI spans sharing the engine span's parent
    /// whose interval holds the engine's, give or take `SIBLING_SKEW_NS`; tightest first.
    fn containing_siblings(&mut self, t: &TraceView<'_>, engine: usize) -> Vec<usize> {
        let slot = t.data.span(engine);
        let (start, end) = (i128::from(slot.start_unix_ns), i128::from(slot.end_unix_ns));
        let mut found = Vec::new();
        for &sibling in self.sibling_candidates(t, &slot.parent_span_id).iter().take(MAX_BELOW) {
            let other = t.data.span(sibling);
            if i128::from(other.start_unix_ns) - SIBLING_SKEW_NS <= start
                && end <= i128::from(other.end_unix_ns) + SIBLING_SKEW_NS {
                found.push(sibling);
                if found.len() == MAX_SIBLINGS {
                    break;
                }
            }
        }
        found
    }
}

/// `requests._split`: the gateways in front of a request among its ancestors, and its outermost
/// client GenAI ancestor. SERVER spans above the client call are the application's own, unless
/// they serve a model API themselves (`_is_llm_endpoint`).
pub(super) fn split(t: &TraceView<'_>, ancestors: &[usize]) -> (Vec<usize>, Option<usize>) {
    let client_at = ancestors.iter().rposition(|&span| t.is_client_side(span));
    let servers = ancestors.iter().enumerate()
        .filter(|&(position, &span)| {
            t.data.span(span).kind == SPAN_KIND_SERVER
                && (client_at.is_none_or(|client| position < client) || t.is_llm_endpoint(span))
        })
        .map(|(_, &span)| span)
        .collect();
    (servers, client_at.map(|position| ancestors[position]))
}

/// `requests.join_ancestors`.
pub(super) fn join_ancestors(t: &TraceView<'_>, span: usize) -> Joined {
    let ancestors = t.data.ancestors(span);
    let (servers, client) = split(t, &ancestors);
    Joined { lookup: ancestors, servers, client }
}

/// `requests.join_engine`: `genai_in_trace`, how many GenAI spans the trace holds (when its
/// ancestors hold them all, nothing beside the chain can name the model: no index is made).
pub(super) fn join_engine(t: &TraceView<'_>, engine: usize, index: &mut Option<TraceIndex>,
                          genai_in_trace: usize) -> Joined {
    let ancestors = t.data.ancestors(engine);
    let slot = t.data.span(engine);
    let mut siblings = Vec::new();
    if slot.has_parent && ancestors.first().is_none_or(|&parent| t.data.span(parent).kind != SPAN_KIND_SERVER) {
        siblings = index.get_or_insert_with(TraceIndex::default).containing_siblings(t, engine);
    }
    let (mut servers, mut client) = split(t, &ancestors);
    if !siblings.is_empty() {
        let mut joined: Vec<usize> = siblings.iter().copied()
            .filter(|&span| t.data.span(span).kind == SPAN_KIND_SERVER).collect();
        joined.extend_from_slice(&servers);
        servers = joined;
    } else {
        let genai_above = ancestors.iter().filter(|&&span| t.is_genai(span)).count();
        if servers.is_empty() || genai_in_trace == genai_above {
            return Joined { lookup: ancestors, servers, client };
        }
    }
    // A gateway's own GenAI spans (LiteLLM's litellm_request under its proxy span) are not above
    // the engine span but beside it: they name the model and are the gateway's call out.
    let index = index.get_or_insert_with(TraceIndex::default);
    let mut below: Vec<usize> = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new(); // at most 64 below each of 68 tops: not the trace's size
    for &top in siblings.iter().chain(servers.iter()) {
        for &span in index.genai_below(t, top) {
            if seen.insert(span) {
                below.push(span);
            }
        }
    }
    if client.is_none() {
        client = siblings.iter().chain(below.iter()).copied().find(|&span| t.is_client_side(span));
    }
    let mut lookup = below;
    lookup.extend_from_slice(&siblings);
    lookup.extend_from_slice(&ancestors);
    Joined { lookup, servers, client }
}
