//! `requests.py`'s records: which spans are requests (`records_of_trace`, `_simple_request`,
//! `_records_of_any_trace`), and one request's record (`build_record` and the rules it calls).

use std::borrow::Cow;
use std::collections::HashMap;

use crate::model::{AnyValue, ObsView, SpanId, SPAN_KIND_SERVER, STATUS_CODE_ERROR};
use crate::record::{outcome, Record, Segment, Side, Text};

use super::join::{join_ancestors, join_engine, Joined, TraceIndex};
use super::read::{adjusted_count, attr_text, first_attribute, number, resource_string, route_operation,
                  Number};
use super::timings::{build_segments, derive_timings, Bounds, ObservedNumbers};
use super::{Decline, Fail, TraceView};

/// `EngineKind`'s values the rules name.
pub(super) const GENAI: &str = "genai";
pub(super) const SGLANG: &str = "sglang";
const TRTLLM: &str = "trtllm";
/// `_COMPOSITE_KINDS` but SGLang: their requests are read from other spans by Python only.
pub(super) const PYTHON_COMPOSITES: [&str; 3] = ["triton", "dynamo", "llm-d"];
/// `adapters.shapes.GENAI_OPERATIONS`: the conventions' well-known operation names.
const GENAI_OPERATIONS: [&str; 9] = ["chat", "text_completion", "embeddings", "generate_content", "execute_tool",
                                     "invoke_agent", "create_agent", "invoke_workflow", "retrieval"];
/// `requests._CALLER_FIRST_KINDS`: an app's GenAI span and the frontends holding the engines'
/// requests (Dynamo, llm-d, declined here but kept for the rule's sake), whose joined spans name
/// the model before their resource does.
const CALLER_FIRST_KINDS: [&str; 3] = [GENAI, "dynamo", "llm-d"];

/// `requests.CLIENT_ENGINE_KIND`, `NO_MODEL_SOURCE`, `Source.DEFAULT`, `_OTHER_ERROR`.
const CLIENT_ENGINE_KIND: &str = "client";
const NO_MODEL_SOURCE: &str = "none";
const DEFAULT_SOURCE: &str = "default";
const OTHER_ERROR: &str = "_OTHER";
/// `composite.ABORTED_ERROR_TYPE` (also `_unanswered_record`'s error type).
pub(super) const ABORTED: &str = "aborted";

/// The model sources `_resolve_model` and `_fallback_model` name from what a span observed
/// (`resource:<attribute>` of the configured rules aside).
pub(super) const OBSERVED_MODEL_SOURCES: [&str; 7] = [
    "span:gen_ai.response.model", "span:gen_ai.request.model", "gateway:gen_ai.response.model",
    "gateway:gen_ai.request.model", "client:gen_ai.response.model", "client:gen_ai.request.model",
    "resource:service.name",
];

/// `requests._FINISH_REASONS`.
const FINISH_REASONS: [(&str, &str); 10] = [
    ("stop", outcome::STOP),
    ("eos", outcome::STOP),
    ("end_turn", outcome::STOP),
    ("stop_sequence", outcome::STOP),
    ("tool_calls", outcome::STOP),
    ("length", outcome::LENGTH),
    ("max_tokens", outcome::LENGTH),
    ("abort", outcome::ABORT),
    ("cancelled", outcome::ABORT),
    ("error", outcome::ERROR),
];

/// `_FINISH_REASONS.get(reason.lower(), Outcome.UNKNOWN)`; declined for a reason that is not
/// ASCII, whose Unicode lowercase (the Kelvin sign's is "k") this crate does not port.
fn finish_outcome(reason: &str) -> Result<&'static str, Decline> {
    if !reason.is_ascii() {
        return Err(Decline::UnicodeCase);
    }
    Ok(FINISH_REASONS.iter().find(|(name, _)| name.eq_ignore_ascii_case(reason))
        .map_or(outcome::UNKNOWN, |(_, outcome)| *outcome))
}

/// A text field of an observation as `field or ""` reads it.
fn text<'t>(obs: &ObsView<'t>, id: crate::model::FieldId) -> &'t str {
    obs.text(id).unwrap_or("")
}

/// A text that is not empty (Python's truthiness), else `None`.
fn truthy(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

/// A span's record-side word in a model or operation source: "client" for a GenAI span that is
/// not a SERVER span, else "gateway".
fn client_side(t: &TraceView<'_>, at: usize) -> bool {
    t.slot(at).kind != SPAN_KIND_SERVER && t.obs(at).is_some() && t.is_genai(at)
}

type Malformed = Vec<(&'static str, String)>;

/// What `requests._resolve_model` returns: the model and its source ("" and "" where nothing
/// names it yet), the request and response models, and what the spans joined with an engine's
/// request named (`heard`, its source), which `_fallback_model` takes after the service name.
struct Resolved<'t> {
    model: Text<'t>,
    source: &'t str,
    request: Text<'t>,
    response: Text<'t>,
    heard: Text<'t>,
    heard_source: &'t str,
}

impl<'t> TraceView<'t> {
    /// `requests.records_of_trace` (without a compiled builder).
    pub(super) fn records_of_trace(&self) -> Result<(Vec<Record<'t>>, Malformed), Decline> {
        let Some((engine, joined)) = self.simple_request() else { return self.records_of_any_trace() };
        match self.build_record(engine, &joined, Side::Server, true) {
            Ok(record) => Ok((vec![record], Vec::new())),
            Err(Fail::Malformed(reason)) => Ok((Vec::new(), vec![(reason, self.data.service_name(engine).to_owned())])),
            Err(Fail::Decline(decline)) => Err(decline),
        }
    }

    /// `requests._simple_request`: the engine span and its join for the shapes most traffic has,
    /// told from one look at the trace (one engine span and no GenAI span, the engine span a root
    /// or the trace's only span; or one engine span directly under the trace's only GenAI span, a
    /// SERVER span with no parent in the trace); `None` for any other shape. What the general
    /// joining makes of these shapes, without its index.
    pub(super) fn simple_request(&self) -> Option<(usize, Joined)> {
        let (mut engine, mut gateway) = (None, None);
        for at in 0..self.data.len() {
            let Some(shape) = self.shape(at) else { continue };
            if !shape.part.is_empty() {
                continue;
            }
            if shape.may_be_gateway {
                if gateway.is_some() {
                    return None;
                }
                gateway = Some(at);
            } else if engine.is_none() {
                engine = Some(at);
            } else {
                return None;
            }
        }
        let engine = engine?;
        let own = self.slot(engine);
        let Some(gateway) = gateway else {
            if own.has_parent && (self.data.len() > 1 || own.parent_span_id == own.span_id) {
                return None;
            }
            return Some((engine, Joined::default()));
        };
        let edge = self.slot(gateway);
        // A gateway with a parent in the trace: a cycle, or a span above it.
        if edge.kind != SPAN_KIND_SERVER || !own.has_parent || own.parent_span_id != edge.span_id
            || (edge.has_parent && self.data.find(&edge.parent_span_id).is_some()) {
            return None;
        }
        Some((engine, Joined { lookup: vec![gateway], servers: vec![gateway], client: None }))
    }

    /// `requests._records_of_any_trace`: server records (engine requests, then gateway-only
    /// requests), then client records.
    pub(super) fn records_of_any_trace(&self) -> Result<(Vec<Record<'t>>, Malformed), Decline> {
        let (mut engines, mut server_genai, mut clients) = (Vec::new(), Vec::new(), Vec::new());
        for at in 0..self.data.len() {
            let Some(shape) = self.shape(at) else { continue };
            if !shape.part.is_empty() {
                continue; // read from its request's root (composite.py)
            }
            if !shape.may_be_gateway {
                engines.push(at);
            } else if self.slot(at).kind == SPAN_KIND_SERVER {
                server_genai.push(at);
            } else {
                clients.push(at);
            }
        }
        if engines.len() > 1 && (self.trtllm_pair(&engines) || self.sglang_pair(&engines)) {
            return Err(Decline::DisaggregatedPair); // `_pair_disaggregated`, `_pair_sglang_pd`: Python's
        }
        let mut records: Vec<Record<'t>> = Vec::new();
        let mut malformed: Malformed = Vec::new();
        let mut index: Option<TraceIndex> = None;
        let mut joined_ids = vec![false; self.data.len()];
        let genai_in_trace = server_genai.len() + clients.len();
        for &engine in &engines {
            let joined = join_engine(self, engine, &mut index, genai_in_trace);
            for &span in &joined.lookup {
                joined_ids[span] = true;
            }
            match self.build_record(engine, &joined, Side::Server, true) {
                Ok(record) => records.push(record),
                Err(Fail::Malformed(reason)) => malformed.push((reason, self.data.service_name(engine).to_owned())),
                Err(Fail::Decline(decline)) => return Err(decline),
            }
        }
        // Python catches `MalformedSpan` around an engine's record only: from any other, it raises.
        let uncaught = |fail: Fail| match fail {
            Fail::Decline(decline) => decline,
            Fail::Malformed(_) => Decline::Uncaught,
        };
        if !server_genai.is_empty() {
            // A GenAI SERVER span with another below it is that one's gateway, not a request of its own.
            for &span in &server_genai {
                if !joined_ids[span] {
                    for ancestor in self.data.ancestors(span) {
                        if self.slot(ancestor).kind == SPAN_KIND_SERVER {
                            joined_ids[ancestor] = true;
                        }
                    }
                }
            }
            for &span in &server_genai {
                if joined_ids[span] {
                    continue;
                }
                let Some(obs) = self.obs(span) else { continue };
                let joined = join_ancestors(self, span);
                let record = if self.has_response(&obs) && !obs.flag(self.builder.fields.is_error) {
                    self.build_record(span, &joined, Side::Server, false)
                } else {
                    self.unanswered_record(span, &joined)
                };
                records.push(record.map_err(uncaught)?);
            }
        }
        if !clients.is_empty() {
            // The server record joined to each client span (of several, the last).
            let served_by_client: HashMap<SpanId, usize> = records.iter().enumerate()
                .filter_map(|(position, record)| record.joined_span_id.map(|id| (id, position))).collect();
            for &span in &clients {
                if self.data.ancestors(span).into_iter().any(|ancestor| self.is_client_side(ancestor)) {
                    continue; // a nested client span is part of the outer call, counted once there
                }
                let served = served_by_client.get(&self.slot(span).span_id).map(|&position| Served::of(&records[position]));
                let record = self.client_record(span, served).map_err(uncaught)?;
                records.push(record);
            }
        }
        Ok((records, malformed))
    }

    /// Whether `_pair_disaggregated` pairs two of these trtllm-serve spans (two under one parent).
    fn trtllm_pair(&self, engines: &[usize]) -> bool {
        let mut by_parent: HashMap<SpanId, usize> = HashMap::new();
        for &span in engines {
            let slot = self.slot(span);
            if slot.has_parent && self.shape(span).is_some_and(|shape| shape.engine_kind == TRTLLM) {
                *by_parent.entry(slot.parent_span_id).or_default() += 1;
            }
        }
        by_parent.values().any(|&count| count == 2)
    }

    /// Whether `_pair_sglang_pd` pairs two of these SGLang roots: a `"prefill Req …"` and a
    /// `"decode Req …"` root with one `bootstrap_room` (its first occurrence on each span; a string
    /// as is, "0" for an empty one, an int in decimal, "0" for anything else, as Python reads it).
    fn sglang_pair(&self, engines: &[usize]) -> bool {
        let roots: Vec<usize> = engines.iter().copied()
            .filter(|&span| self.shape(span).is_some_and(|shape| shape.engine_kind == SGLANG && shape.part.is_empty()))
            .collect();
        if roots.len() < 2 {
            return false;
        }
        let mut by_room: HashMap<Cow<'t, str>, (bool, bool)> = HashMap::new();
        for span in roots {
            let name = self.data.name(span);
            let Some((role, _)) = name.split_once(" Req ") else { continue };
            if role != "prefill" && role != "decode" {
                continue;
            }
            let room: Cow<'t, str> = match first_attribute(self.data.body(span), "bootstrap_room") {
                None => continue,
                Some(AnyValue::Str(room)) if !room.is_empty() => Cow::Borrowed(room),
                Some(AnyValue::Int(room)) => Cow::Owned(room.to_string()),
                Some(_) => Cow::Borrowed("0"),
            };
            let roles = by_room.entry(room).or_default();
            if role == "prefill" {
                roles.0 = true;
            } else {
                roles.1 = true;
            }
        }
        by_room.values().any(|&(prefill, decode)| prefill && decode)
    }

    /// `requests._has_response`.
    fn has_response(&self, obs: &ObsView<'t>) -> bool {
        let f = &self.builder.fields;
        !text(obs, f.response_model).is_empty() || obs.int(f.completion).is_some()
            || !text(obs, f.finish_reason).is_empty() || obs.float(f.ttft).is_some()
    }

    /// `requests._unanswered_record`: a GenAI SERVER span with no engine span joined to it that
    /// failed, or never reported a response (a client abort: vLLM emits no span for those).
    fn unanswered_record(&self, span: usize, joined: &Joined) -> Result<Record<'t>, Fail> {
        let mut record = self.build_record(span, joined, Side::Server, false)?;
        let is_error = self.obs(span).is_some_and(|obs| obs.flag(self.builder.fields.is_error));
        record.outcome = Cow::Borrowed(if is_error { outcome::ERROR } else { outcome::ABORT });
        if !is_error {
            record.error_type = Cow::Borrowed(ABORTED);
        }
        record.engine_kind = Cow::Borrowed(GENAI);
        record.edge_span_id = Some(self.slot(joined.servers.last().copied().unwrap_or(span)).span_id);
        Ok(record)
    }

    /// `requests._client_record`: the outermost client span of a call, with the model of the
    /// server record joined to it where its own spans name none.
    fn client_record(&self, span: usize, served: Option<Served<'t>>) -> Result<Record<'t>, Fail> {
        let joined = join_ancestors(self, span);
        let mut record = self.build_record(span, &joined, Side::Client, false)?;
        if let Some(served) = served {
            record.joined_span_id = Some(served.span_id);
            if record.request_model.is_empty() && !served.request_model.is_empty() && served.model_source != DEFAULT_SOURCE {
                record.request_model = served.request_model;
            }
            let unnamed = |source: &str| source == NO_MODEL_SOURCE || source == DEFAULT_SOURCE;
            if unnamed(&record.model_source) && !unnamed(&served.model_source) {
                record.model = served.model;
                record.model_source = match self.builder.engine_sources.iter().find(|(s, _)| *s == served.model_source) {
                    Some((_, engine)) => Cow::Borrowed(engine.as_str()),
                    None => Cow::Owned(format!("engine:{}", served.model_source)),
                };
            }
        }
        Ok(record)
    }

    /// An observation's numbers as `derive_timings` reads them.
    fn numbers(&self, obs: &ObsView<'t>) -> ObservedNumbers {
        let f = &self.builder.fields;
        let (mut prefill_derived, mut decode_derived) = (false, false);
        if obs.has(f.derived) {
            for name in obs.texts(f.derived).iter() {
                prefill_derived |= name == "prefill";
                decode_derived |= name == "decode";
            }
        }
        ObservedNumbers {
            ttft_s: obs.float(f.ttft),
            e2e_s: obs.float(f.e2e),
            queue_s: obs.float(f.queue),
            prefill_s: obs.float(f.prefill),
            decode_s: obs.float(f.decode),
            inference_s: obs.float(f.inference),
            preprocess_s: obs.float(f.preprocess),
            tpot_s: obs.float(f.tpot),
            prompt_tokens: obs.int(f.prompt),
            completion_tokens: obs.int(f.completion),
            prefill_derived,
            decode_derived,
        }
    }

    /// `requests.build_record` for a request of a span with an observation. `with_trace`: the
    /// request's other spans are read (an SGLang root's stage spans, `composite.sglang`).
    pub(super) fn build_record(&self, at: usize, joined: &Joined, side: Side, with_trace: bool) -> Result<Record<'t>, Fail> {
        let b = self.builder;
        let f = &b.fields;
        let (Some(obs), Some(shape)) = (self.obs(at), self.shape(at)) else { return Err(Fail::Decline(Decline::UnknownShape)) };
        let slot = self.slot(at);
        let lookup = joined.lookup.as_slice();
        let resolved = self.resolve_model(at, &obs, &shape.engine_kind, lookup)?;
        let (operation, operation_source) = self.operation(at, &obs, lookup)?;
        let dimensions = if b.settings.dimensions.is_empty() { Vec::new() } else { self.dimensions(at, lookup)? };
        let tenant = match &b.settings.tenant {
            Some(rule) => self.tenant(at, lookup, rule)?,
            None => Cow::Borrowed(""),
        };
        let trace_state = self.data.trace_state(at);
        let weight = if trace_state.is_empty() { 1.0 } else { adjusted_count(trace_state)? };
        let server = side == Side::Server;
        let timings = derive_timings(&self.numbers(&obs)).map_err(Fail::Malformed)?;
        // Kept as Python's unbounded ints until the record is made: one past `i64` declines it then.
        let mut bounds = if server {
            build_segments(i128::from(slot.start_unix_ns), &timings).ok_or(Decline::TimeRange)?
        } else {
            Vec::new()
        };
        let mut record = Record::new(self.data.trace_id, slot.span_id);
        record.engine_kind = Cow::Borrowed(if server { shape.engine_kind.as_str() } else { CLIENT_ENGINE_KIND });
        record.adapter = Cow::Borrowed(&shape.adapter);
        record.service_name = Cow::Borrowed(self.data.service_name(at));
        (record.model, record.model_source, record.request_model, record.response_model) =
            (resolved.model, Cow::Borrowed(resolved.source), resolved.request, resolved.response);
        (record.operation_name, record.operation_source) = (operation, Cow::Borrowed(operation_source));
        record.provider_name = Cow::Borrowed(text(&obs, f.provider_name));
        record.outcome = Cow::Borrowed(self.outcome(&obs)?);
        record.side = side;
        record.error_type = Cow::Borrowed(text(&obs, f.error_type));
        record.server_address = Cow::Borrowed(text(&obs, f.server_address));
        record.server_port = Cow::Borrowed(text(&obs, f.server_port));
        record.ttft_s = timings.ttft_s;
        record.tpot_s = timings.tpot_s;
        record.e2e_s = timings.e2e_s;
        record.queue_s = timings.queue_s;
        record.prefill_s = timings.prefill_s;
        record.decode_s = timings.decode_s;
        record.inference_s = timings.inference_s;
        record.prompt_tokens = obs.int(f.prompt);
        record.completion_tokens = obs.int(f.completion);
        record.dimensions = dimensions;
        record.weight = weight;
        record.not_measurable = timings.not_measurable.iter().map(|name| Cow::Borrowed(*name)).collect();
        if obs.has(f.derived) {
            record.segments_derived = obs.texts(f.derived).iter().map(Cow::Borrowed).collect();
        }
        record.cached_tokens = obs.int(f.cached);
        record.cache_write_tokens = obs.int(f.cache_write);
        record.reasoning_tokens = obs.int(f.reasoning);
        record.itl_s = obs.floats(f.itl).iter().collect();
        record.tenant = tenant;
        let mut rejected: Vec<Text<'t>> = Vec::new();
        if server && with_trace && shape.engine_kind == SGLANG {
            self.sglang(&mut record, at, &obs, &mut bounds)?;
        }
        self.read_cache_and_spec(&mut record, &obs, if server { lookup } else { &[] }, &mut rejected);
        if record.e2e_s.is_none() {
            // GenAI spans carry no e2e and TGI records its fields only on success: the span's own
            // duration is the request's.
            record.e2e_s = self.span_seconds(at, &mut rejected);
        }
        if server {
            self.join_server_side(&mut record, &obs, shape.engine_kind == GENAI, joined, &mut rejected)?;
        }
        if record.model.is_empty() {
            let (model, source) = self.fallback_model(at, shape.engine_kind == GENAI, resolved.heard, resolved.heard_source);
            (record.model, record.model_source) = (model, Cow::Borrowed(source));
        }
        if !b.settings.lora_adapters.is_empty() {
            self.name_adapter(&mut record);
        }
        record.rejected = rejected;
        record.start_unix_ns = i64::try_from(slot.start_unix_ns).map_err(|_| Decline::TimeRange)?;
        record.segments = segments_of(bounds)?;
        for &(field, to) in &b.carried {
            if let Some(value) = obs.get(field, b.kinds[field.0 as usize]) {
                record.extra.push((to, value.to_owned()));
            }
        }
        Ok(record)
    }

    /// `requests._resolve_model`: DESIGN.md §3's rules (the span, the spans joined with it, the
    /// resource mapping), ordered by whose span it is; "" where nothing says (`_fallback_model`
    /// comes after the request's other parts were read). An engine's own span and resource come
    /// before what its callers' spans name (`heard`: its request model here, its model label only
    /// in `_fallback_model`); `CALLER_FIRST_KINDS` keep §3's order.
    fn resolve_model(&self, at: usize, own: &ObsView<'t>, engine_kind: &str, lookup: &[usize])
                     -> Result<Resolved<'t>, Decline> {
        let f = &self.builder.fields;
        let mut response: Text<'t> = Cow::Borrowed(text(own, f.response_model));
        let mut request: Text<'t> = Cow::Borrowed(text(own, f.request_model));
        let (model, source): (Text<'t>, &'t str) = if !response.is_empty() {
            (response.clone(), "span:gen_ai.response.model")
        } else if !request.is_empty() {
            (request.clone(), "span:gen_ai.request.model")
        } else {
            (Cow::Borrowed(""), "")
        };
        let (mut heard, mut heard_source): (Text<'t>, &'t str) = (Cow::Borrowed(""), "");
        for &span in lookup {
            if !response.is_empty() && !request.is_empty() {
                break;
            }
            let (span_response, span_request): (Option<Text<'t>>, Option<Text<'t>>) = match self.obs(span) {
                Some(observed) => (truthy(text(&observed, f.response_model)).map(Cow::Borrowed),
                                   truthy(text(&observed, f.request_model)).map(Cow::Borrowed)),
                None => {
                    // `_models` of a span no adapter claimed: its kept attributes.
                    let response = attr_text(self.attr(span, "gen_ai.response.model")).text()?;
                    let request = attr_text(self.attr(span, "gen_ai.request.model")).text()?;
                    (response.filter(|t| !t.is_empty()), request.filter(|t| !t.is_empty()))
                }
            };
            if model.is_empty() && heard.is_empty() && (span_response.is_some() || span_request.is_some()) {
                let client = client_side(self, span);
                heard_source = match (client, span_response.is_some()) {
                    (true, true) => "client:gen_ai.response.model",
                    (true, false) => "client:gen_ai.request.model",
                    (false, true) => "gateway:gen_ai.response.model",
                    (false, false) => "gateway:gen_ai.request.model",
                };
                heard = span_response.clone().or_else(|| span_request.clone()).unwrap_or_default();
            }
            if response.is_empty() {
                response = span_response.unwrap_or_default();
            }
            if request.is_empty() {
                request = span_request.unwrap_or_default();
            }
        }
        if !model.is_empty() {
            let request = if request.is_empty() { model.clone() } else { request };
            return Ok(Resolved { model, source, request, response, heard: Cow::Borrowed(""), heard_source: "" });
        }
        // `request or heard`: what was asked for, whichever rule names the label.
        let asked = if request.is_empty() { heard.clone() } else { request };
        if !heard.is_empty() && CALLER_FIRST_KINDS.contains(&engine_kind) {
            return Ok(Resolved { model: heard, source: heard_source, request: asked, response,
                                 heard: Cow::Borrowed(""), heard_source: "" });
        }
        let resource = self.data.resource(at);
        let mut named: Option<(&'t str, &'t str)> = None;
        for (rule, rule_source) in self.builder.settings.resource_model_rules.iter().zip(&self.builder.resource_sources) {
            let Some(raw) = resource_string(resource, &rule.attribute) else { continue };
            if rule.values.is_empty() {
                named = Some((raw, rule_source));
                break;
            }
            if let Some(mapped) = rule.values.get(raw) {
                named = Some((mapped, rule_source));
                break;
            }
        }
        let (model, source, request) = match named {
            Some((model, source)) => {
                (Cow::Borrowed(model), source, if asked.is_empty() { Cow::Borrowed(model) } else { asked })
            }
            None => (Cow::Borrowed(""), NO_MODEL_SOURCE, asked),
        };
        Ok(Resolved { model, source, request, response, heard, heard_source })
    }

    /// `requests._fallback_model`: the engine's service name, then what a joined gateway or client
    /// span named (`heard`, from `resolve_model`), then the configured default; the model label only.
    fn fallback_model(&self, at: usize, genai: bool, heard: Text<'t>, heard_source: &'t str) -> (Text<'t>, &'t str) {
        let settings = &self.builder.settings;
        if settings.model_from_service_name && !genai {
            if let Some(service) = resource_string(self.data.resource(at), "service.name") {
                if !service.is_empty() && !service.starts_with("unknown_service") {
                    return (Cow::Borrowed(service), "resource:service.name");
                }
            }
        }
        if !heard.is_empty() {
            return (heard, heard_source);
        }
        if !settings.default_model.is_empty() {
            return (Cow::Borrowed(&settings.default_model), DEFAULT_SOURCE);
        }
        (Cow::Borrowed(""), NO_MODEL_SOURCE)
    }

    /// `requests._outcome`.
    fn outcome(&self, obs: &ObsView<'t>) -> Result<&'static str, Decline> {
        let f = &self.builder.fields;
        if obs.flag(f.is_error) {
            return Ok(outcome::ERROR);
        }
        if let Some(reason) = truthy(text(obs, f.finish_reason)) {
            return finish_outcome(reason);
        }
        if let (Some(max), Some(completion)) = (obs.int(f.max_tokens), obs.int(f.completion)) {
            if max != 0 && completion >= max {
                return Ok(outcome::LENGTH);
            }
        }
        Ok(outcome::UNKNOWN)
    }

    /// `requests._route` looked up in `_ROUTE_OPERATIONS`.
    fn route_operation(&self, at: usize) -> Option<&'static str> {
        route_operation(attr_text(self.attr(at, "http.route")), || attr_text(self.attr(at, "url.path")))
    }

    /// `requests._is_llm_endpoint`: a SERVER span serving a model API (a GenAI span, or one whose
    /// route is a model API's).
    pub(super) fn is_llm_endpoint(&self, at: usize) -> bool {
        self.is_genai(at) || self.route_operation(at).is_some()
    }

    /// `requests._operation`: a well-known value wherever one applies (the span's, a joined
    /// span's, a route's), a custom one only where none does.
    fn operation(&self, at: usize, obs: &ObsView<'t>, lookup: &[usize]) -> Result<(Text<'t>, &'t str), Decline> {
        let f = &self.builder.fields;
        let mut custom: Option<(&'t str, &'t str)> = None;
        if let Some(name) = truthy(text(obs, f.operation_name)) {
            if GENAI_OPERATIONS.contains(&name) {
                return Ok((Cow::Borrowed(name), "span"));
            }
            custom = Some((name, "span"));
        }
        if let Some(operation) = self.route_operation(at) {
            return Ok((Cow::Borrowed(operation), "route"));
        }
        for &span in lookup {
            if let Some(name) = self.obs(span).and_then(|observed| truthy(text(&observed, f.operation_name))) {
                let side = if client_side(self, span) { "client" } else { "gateway" };
                if GENAI_OPERATIONS.contains(&name) {
                    return Ok((Cow::Borrowed(name), side));
                }
                custom = custom.or(Some((name, side)));
            }
            if let Some(operation) = self.route_operation(span) {
                return Ok((Cow::Borrowed(operation), "route"));
            }
        }
        Ok(match custom {
            Some((name, side)) => (Cow::Borrowed(name), side),
            None => (Cow::Borrowed(self.builder.settings.default_operation.as_str()), DEFAULT_SOURCE),
        })
    }

    /// `requests._dimensions`: each configured dimension's value from the span, the spans joined
    /// with it, then its resource; `other` unless allow-listed.
    fn dimensions(&self, at: usize, lookup: &[usize]) -> Result<Vec<Text<'t>>, Decline> {
        let mut values = Vec::with_capacity(self.builder.settings.dimensions.len());
        for dimension in &self.builder.settings.dimensions {
            let mut found: Option<Text<'t>> = None;
            for span in std::iter::once(at).chain(lookup.iter().copied()) {
                found = attr_text(self.attr(span, &dimension.attribute)).text()?;
                if found.is_some() {
                    break;
                }
            }
            if found.is_none() {
                found = resource_string(self.data.resource(at), &dimension.attribute).map(Cow::Borrowed);
            }
            values.push(match found {
                Some(value) if dimension.allowed.contains(value.as_ref()) => value,
                _ => Cow::Borrowed(dimension.other.as_str()),
            });
        }
        Ok(values)
    }

    /// `requests._tenant`: the nearest span's first tenant attribute, then the resource's.
    fn tenant(&self, at: usize, lookup: &[usize], rule: &'t super::TenantRule) -> Result<Text<'t>, Decline> {
        let judged = |found: Text<'t>| if rule.allowed.contains(found.as_ref()) { found } else { Cow::Borrowed(rule.other.as_str()) };
        for span in std::iter::once(at).chain(lookup.iter().copied()) {
            for attribute in &rule.attributes {
                if let Some(found) = attr_text(self.attr(span, attribute)).text()? {
                    if !found.is_empty() {
                        return Ok(judged(found));
                    }
                }
            }
        }
        for attribute in &rule.attributes {
            if let Some(found) = resource_string(self.data.resource(at), attribute) {
                if !found.is_empty() {
                    return Ok(judged(Cow::Borrowed(found)));
                }
            }
        }
        Ok(Cow::Borrowed(""))
    }

    /// `requests._read_cache_and_spec`: cache reads/writes and speculative decoding, the engine
    /// span's, else the nearest joined span's that reports them (the server side only); a count
    /// the request's prompt cannot hold is rejected.
    fn read_cache_and_spec(&self, record: &mut Record<'t>, obs: &ObsView<'t>, lookup: &[usize], rejected: &mut Vec<Text<'t>>) {
        let f = &self.builder.fields;
        let spec_of = |o: &ObsView<'t>| {
            let spec = (o.int(f.spec_accepted), o.int(f.spec_draft), o.int(f.spec_steps));
            (spec.0.is_some() || spec.1.is_some() || spec.2.is_some()).then_some(spec)
        };
        let (mut cached, mut written, mut spec) = (record.cached_tokens, obs.int(f.cache_write), spec_of(obs));
        if let Some(reason) = truthy(text(obs, f.spec_decode_rejected)) {
            rejected.push(Cow::Borrowed(reason));
        }
        for &span in lookup {
            if cached.is_some() && written.is_some() && spec.is_some() {
                break;
            }
            let Some(seen) = self.obs(span) else { continue };
            cached = cached.or(seen.int(f.cached));
            written = written.or(seen.int(f.cache_write));
            spec = spec.or(spec_of(&seen));
        }
        let prompt = record.prompt_tokens;
        let holds = |count: i64| count >= 0 && prompt.is_none_or(|prompt| count <= prompt);
        if cached.is_some_and(|count| !holds(count)) {
            rejected.push(Cow::Borrowed("cached_tokens_exceed_prompt"));
            cached = None;
        }
        if written.is_some_and(|count| !holds(count)) {
            rejected.push(Cow::Borrowed("cache_write_tokens_exceed_prompt"));
            written = None;
        }
        (record.cached_tokens, record.cache_write_tokens) = (cached, written);
        if let Some((accepted, draft, steps)) = spec {
            (record.spec_accepted_tokens, record.spec_draft_tokens, record.spec_steps) = (accepted, draft, steps);
        }
    }

    /// `requests._span_seconds`: the span's duration, if its times make one within the bound.
    fn span_seconds(&self, at: usize, rejected: &mut Vec<Text<'t>>) -> Option<f64> {
        let slot = self.slot(at);
        let (start, end) = (slot.start_unix_ns, slot.end_unix_ns);
        if start == 0 || end < start {
            rejected.push(Cow::Borrowed("invalid_span_times"));
            return None;
        }
        let seconds = (end - start) as f64 / 1e9;
        if seconds <= self.builder.settings.max_latency_s {
            return Some(seconds);
        }
        rejected.push(Cow::Borrowed("absurd_span_duration"));
        None
    }

    /// `requests._valid_seconds`: a usable duration, else `None` with `reason` noted.
    fn valid_seconds(&self, value: f64, reason: &'static str, rejected: &mut Vec<Text<'t>>) -> Option<f64> {
        if value.is_finite() && 0.0 <= value && value <= self.builder.settings.max_latency_s {
            return Some(value);
        }
        rejected.push(Cow::Borrowed(reason));
        None
    }

    /// `requests._edge_ttft`: the gateway's time to first token, from the first configured
    /// attribute it has, else from its first-token event (kept on SERVER spans only).
    fn edge_ttft(&self, edge: usize, rejected: &mut Vec<Text<'t>>) -> Result<Option<f64>, Decline> {
        for key in &self.builder.settings.edge_ttft_attributes {
            match number(self.attr(edge, key))? {
                Number::Absent => {}
                Number::Invalid => rejected.push(Cow::Borrowed("invalid_edge_ttft")),
                Number::Value(value) => return Ok(self.valid_seconds(value, "invalid_edge_ttft", rejected)),
            }
        }
        let slot = self.slot(edge);
        if slot.kind != SPAN_KIND_SERVER {
            return Ok(None);
        }
        let event_ns = self.data.first_event_ns(edge, &self.builder.settings.first_token_events);
        if event_ns != 0 && slot.start_unix_ns > 0 {
            let offset = (i128::from(event_ns) - i128::from(slot.start_unix_ns)) as f64 / 1e9;
            return Ok(self.valid_seconds(offset, "invalid_edge_ttft", rejected));
        }
        Ok(None)
    }

    /// `requests._overhead`: a caller's duration minus the engine's e2e; negative is not
    /// measurable for this request (counted), never a made-up 0.
    fn overhead(value: f64, reason: &'static str, rejected: &mut Vec<Text<'t>>) -> Option<f64> {
        if value >= 0.0 {
            return Some(value);
        }
        rejected.push(Cow::Borrowed(reason));
        None
    }

    /// `requests._join_server_side`: what the gateways in front of a request and its client say.
    fn join_server_side(&self, record: &mut Record<'t>, obs: &ObsView<'t>, genai: bool, joined: &Joined,
                        rejected: &mut Vec<Text<'t>>) -> Result<(), Decline> {
        let f = &self.builder.fields;
        if record.outcome == outcome::UNKNOWN && text(obs, f.finish_reason).is_empty() {
            // vLLM V1 reports no finish reason; the client or gateway that got the response does.
            let reason = joined.lookup.iter()
                .find_map(|&span| self.obs(span).and_then(|observed| truthy(text(&observed, f.finish_reason))));
            if let Some(reason) = reason {
                record.outcome = Cow::Borrowed(finish_outcome(reason)?);
            }
        }
        let failed_gateway = joined.servers.iter().copied().find(|&span| self.slot(span).status_code == STATUS_CODE_ERROR);
        if let Some(gateway) = failed_gateway {
            if record.outcome != outcome::ERROR {
                // The client got an error from the edge: that is the request's outcome.
                record.outcome = Cow::Borrowed(outcome::ERROR);
                record.error_type = match attr_text(self.attr(gateway, "error.type")).text()? {
                    Some(found) if !found.is_empty() => found,
                    _ => Cow::Borrowed(OTHER_ERROR),
                };
            }
        }
        let engine_e2e = if genai { None } else { record.e2e_s };
        if let Some(&edge) = joined.servers.last() {
            record.edge_span_id = Some(self.slot(edge).span_id);
            let edge_duration = self.span_seconds(edge, rejected);
            if let (Some(e2e), Some(duration)) = (engine_e2e, edge_duration) {
                record.gateway_overhead_s = Self::overhead(duration - e2e, "negative_gateway_overhead", rejected);
            }
            record.edge_ttft_s = self.edge_ttft(edge, rejected)?;
        }
        if let Some(client) = joined.client {
            record.joined_span_id = Some(self.slot(client).span_id);
            let client_duration = self.span_seconds(client, rejected);
            if let (Some(e2e), Some(duration)) = (engine_e2e, client_duration) {
                record.client_overhead_s = Self::overhead(duration - e2e, "negative_client_overhead", rejected);
            }
        }
        Ok(())
    }

    /// `requests._name_adapter`: the configured LoRA adapter the request names, as its requested,
    /// answered or served model.
    fn name_adapter(&self, record: &mut Record<'t>) {
        let adapters = &self.builder.settings.lora_adapters;
        for name in [&record.request_model, &record.response_model, &record.model] {
            if name.is_empty() {
                continue;
            }
            if let Some(base) = adapters.get(name.as_ref()) {
                let name = name.clone();
                (record.lora_adapter, record.lora_base_model) = (name, Cow::Borrowed(base.as_str()));
                return;
            }
        }
    }
}

/// Segments as a record holds them: declined where a bound is beyond `i64`.
pub(super) fn segments_of<'t>(bounds: Vec<Bounds>) -> Result<Vec<Segment<'t>>, Decline> {
    bounds.into_iter().map(|(name, start, end)| {
        let start = i64::try_from(start).map_err(|_| Decline::TimeRange)?;
        let end = i64::try_from(end).map_err(|_| Decline::TimeRange)?;
        Ok(Segment { name: Cow::Borrowed(name), start_unix_ns: start, end_unix_ns: end })
    }).collect()
}

/// What a client record reads of the server record joined to it.
struct Served<'t> {
    span_id: SpanId,
    model: Text<'t>,
    model_source: Text<'t>,
    request_model: Text<'t>,
}

impl<'t> Served<'t> {
    fn of(record: &Record<'t>) -> Served<'t> {
        Served {
            span_id: record.span_id,
            model: record.model.clone(),
            model_source: record.model_source.clone(),
            request_model: record.request_model.clone(),
        }
    }
}
