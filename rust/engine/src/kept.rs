//! The kept-trace writer: a kept trace as it leaves otel-llm, written from the trace's own bytes
//! (`otel_llm/processor/redaction/synthesis.py` `kept_trace`, and `rust/src/kept.rs`, the PyO3
//! writer this replaces). Every span, resource and scope passes the redaction's rules
//! (`Redaction`: the allowlist, the content keys and events, the free-text limit, metadata URLs
//! reduced, the status message judged as text); each span with a request record gets the `gen_ai`
//! bridge attributes and the sampling policy (`enrich`), and its segments as synthesized child
//! spans with deterministic BLAKE2b ids. The output is what Python's path hands the exporters and
//! the store: the `ExportTraceServiceRequest`'s bytes exactly as `SerializeToString()` writes
//! Python's message, the store's rows (`span_rows.span_row`, attributes as `json.dumps` writes
//! them) and the counts of what was removed, by reason.
//!
//! Where Python's reading is one this writer does not port, it declines (`Decline`) and Python
//! writes the trace: a span whose attribute key repeats, an attribute value of an unusual shape (a
//! second value field, a string-table index, an unknown field), bytes Python refuses to parse, a
//! segment time Python refuses (negative), a trace of more origins than `TraceData` numbers. A glob
//! with a character class is refused when the writer is made (`KeptWriter::new`). Differential
//! tests: `tests/kept_differential.rs`, against the corpus `tests/data/kept/generate.py` makes
//! with the Python reference.

mod rules;
mod span;
mod value;

use std::borrow::Cow;
use std::collections::HashMap;

use blake2::digest::{Update, VariableOutput};
use blake2::Blake2bVar;

use crate::model::{Decision, Names, SpanId, TraceData, SPAN_KIND_INTERNAL};
use crate::record::{Record, Side};
use crate::wire::{validate, DistinctKeys, Malformed, Msg};

use rules::{Rules, Verdict, GENAI};
use span::{Attr, Children, Shown};
use value::{delimited_size, hex, json_string, put_delimited, put_header, Value};

/// `synthesis.SCOPE_NAME`: the scope of the synthesized segment spans.
pub const SCOPE_NAME: &str = "otel-llm";
/// `synthesis.SEGMENT_ATTRIBUTE`: a segment span's one attribute, its segment's name.
pub const SEGMENT_ATTRIBUTE: &str = "otel_llm.segment";
/// `synthesis.POLICY_ATTRIBUTE`: the policy that kept the trace, on each record's span.
pub const POLICY_ATTRIBUTE: &str = "otel_llm.sampling.policy";
/// `records.Source.DEFAULT`: an operation name configured, not observed (not stamped).
const DEFAULT_SOURCE: &str = "default";
/// `span_rows.INT64_MAX`: the store's times are signed.
const INT64_MAX: u64 = i64::MAX as u64;

/// `synthesis.Redaction`'s settings, as `stage.redaction_of` makes them from the configuration
/// (`processors.redaction`); the binding fills each field from the Python `Redaction`.
#[derive(Clone, Debug, PartialEq)]
pub struct Redaction {
    /// `key_prefixes`: a key starting with one is a content key (removed).
    pub key_prefixes: Vec<String>,
    /// `key_patterns`: `fnmatch` globs of content keys (a character class, `[`, is refused).
    pub key_patterns: Vec<String>,
    /// `event_names`: an event of one of these names loses its attributes.
    pub event_names: Vec<String>,
    /// `max_free_text_bytes`: on a GenAI span, text longer than this is removed (0: no such rule).
    pub max_free_text_bytes: usize,
    /// `allowed_keys`: keys kept whatever their value.
    pub allowed_keys: Vec<String>,
    /// `allowed_patterns`: globs of keys kept whatever their value.
    pub allowed_patterns: Vec<String>,
    /// `metadata_keys`: the only keys whose text is kept (`None`: no allowlist, `allow_content`).
    pub metadata_keys: Option<Vec<String>>,
    /// `url_keys`: metadata keys whose text is a URL, kept without userinfo, query and fragment.
    pub url_keys: Vec<String>,
    /// `config.STATUS_MESSAGE_KEY`: the key a span's status message is judged under.
    pub status_message_key: String,
    /// `synthesis.ERROR_TYPE_KEY`: the attribute a removed status message is reduced to.
    pub error_type_key: String,
}

impl Default for Redaction {
    /// `synthesis.NO_REDACTION`: no rule at all.
    fn default() -> Redaction {
        Redaction {
            key_prefixes: Vec::new(),
            key_patterns: Vec::new(),
            event_names: Vec::new(),
            max_free_text_bytes: 0,
            allowed_keys: Vec::new(),
            allowed_patterns: Vec::new(),
            metadata_keys: None,
            url_keys: Vec::new(),
            status_message_key: "otel.status_description".to_owned(),
            error_type_key: "error.type".to_owned(),
        }
    }
}

/// `synthesis.REDACTION_REASONS`, in `RedactionCounts.by_reason`'s order.
pub const REDACTION_REASONS: [&str; 5] = ["content_key", "free_text", "content_event", "not_allowed", "url_reduced"];

/// `synthesis.RedactionCounts`: what the rules removed (or reduced), by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedactionCounts {
    /// Attributes removed by a content key rule.
    pub content_keys: u64,
    /// Long text values removed from GenAI spans.
    pub free_text: u64,
    /// Attributes of content events removed.
    pub content_events: u64,
    /// Text under a key that is not known metadata (the allowlist).
    pub not_allowed: u64,
    /// URLs kept without their query, fragment and userinfo.
    pub url_reduced: u64,
}

impl RedactionCounts {
    fn add(&mut self, other: &RedactionCounts) {
        self.content_keys += other.content_keys;
        self.free_text += other.free_text;
        self.content_events += other.content_events;
        self.not_allowed += other.not_allowed;
        self.url_reduced += other.url_reduced;
    }

    /// `RedactionCounts.by_reason`.
    pub fn by_reason(&self) -> [(&'static str, u64); 5] {
        let counts = [self.content_keys, self.free_text, self.content_events, self.not_allowed, self.url_reduced];
        std::array::from_fn(|i| (REDACTION_REASONS[i], counts[i]))
    }
}

/// A row of the store's `spans` table (`span_rows.SpanRow`), as native values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanRowOut {
    /// Hex (`bytes.hex()`), as are the span id and the parent's.
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub kind: i32,
    pub service_name: String,
    /// `span_rows.int64`: a time past `i64::MAX` is `i64::MAX`.
    pub start_unix_ns: i64,
    pub end_unix_ns: i64,
    pub status_code: i32,
    pub status_message: String,
    /// `encode_json(attribute_values(span.attributes))`.
    pub attributes_json: String,
}

/// What `kept_trace` returns: the request's bytes, its rows (in the request's order), how many
/// spans it holds, and what redaction removed.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptOut {
    pub request: Vec<u8>,
    pub rows: Vec<SpanRowOut>,
    pub spans: usize,
    pub redacted: RedactionCounts,
}

/// Why the writer left a trace to Python's (`kept_trace`), for the binding to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decline {
    /// Bytes Python's parse refuses (`DecodeError`): its path raises.
    Malformed,
    /// A span whose attribute key repeats: Python's `apply_into` and `attribute_values` path.
    RepeatedKey,
    /// An attribute's `KeyValue` with its key or value twice (upb's last-wins and merge).
    FieldTwice,
    /// An attribute value with a second value field, a string-table index or an unknown field.
    ValueShape,
    /// A segment time Python refuses (`ValueError`: out of the uint64 range).
    SegmentTime,
    /// More origins than a trace numbers (`TraceData` shares the last index beyond `u16::MAX`).
    Origins,
}

impl Decline {
    pub fn as_str(self) -> &'static str {
        match self {
            Decline::Malformed => "malformed",
            Decline::RepeatedKey => "repeated_key",
            Decline::FieldTwice => "field_twice",
            Decline::ValueShape => "value_shape",
            Decline::SegmentTime => "segment_time",
            Decline::Origins => "origins",
        }
    }
}

impl From<Malformed> for Decline {
    fn from(_: Malformed) -> Decline {
        Decline::Malformed
    }
}

/// `stage.one_per_request`: the records a store row is written for; a client record joined to a
/// server record is the same request, described once (by the server record).
pub fn one_per_request<'r, 't>(records: &'r [Record<'t>]) -> impl Iterator<Item = &'r Record<'t>> {
    records.iter().filter(|r| r.side == Side::Server || r.joined_span_id.is_none())
}

/// `synthesis.segment_span_id`: BLAKE2b-64 of (trace id, engine span id, segment name); the
/// all-zero id, invalid, is `...01`.
pub fn segment_span_id(trace_id: &[u8], span_id: &[u8], name: &str) -> [u8; 8] {
    let mut digest = [0u8; 8];
    if let Ok(mut hasher) = Blake2bVar::new(digest.len()) {
        hasher.update(trace_id);
        hasher.update(span_id);
        hasher.update(name.as_bytes());
        // The output's length is the hasher's: this cannot fail.
        let _ = hasher.finalize_variable(&mut digest);
    }
    if digest == [0u8; 8] {
        digest[7] = 1;
    }
    digest
}

/// One scope's spans in the request, or one resource's synthesized segment spans.
struct Group {
    scope: Vec<u8>,
    spans: Vec<u8>, // `ScopeSpans.spans` fields
    rows: Vec<SpanRowOut>,
}

struct ResourceGroup {
    resource: Vec<u8>,
    service_name: String,
    groups: Vec<Group>,
    synthesized: Option<usize>,
}

/// The request's resources as they are made: spans of equal resource bytes are one resource, as
/// the spans of one request's resource share its message in Python (its binding must make them so
/// for the traces it writes itself); each origin (resource and scope) is one scope group of it.
struct Groups<'d> {
    resources: Vec<ResourceGroup>,
    by_bytes: HashMap<&'d [u8], usize>,
    by_origin: Vec<Option<(usize, usize)>>,
}

impl ResourceGroup {
    /// The record's segments as spans of the resource's `otel-llm` scope (made when first needed,
    /// after the scopes met so far), with their rows; how many. A segment time out of the uint64
    /// range declines: Python raises `ValueError`.
    fn write_segments(&mut self, record: &Record<'_>, written: &Written<'_>, member: &str, trace_hex: &str,
                      span_hex: &str) -> Result<usize, Decline> {
        let synthesized = match self.synthesized {
            Some(index) => index,
            None => {
                let mut scope = Vec::new();
                put_delimited(&mut scope, 0x0a, SCOPE_NAME.as_bytes());
                self.groups.push(Group { scope, spans: Vec::new(), rows: Vec::new() });
                self.synthesized = Some(self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        let group = &mut self.groups[synthesized];
        for segment in &record.segments {
            let (Ok(start), Ok(end)) = (u64::try_from(segment.start_unix_ns), u64::try_from(segment.end_unix_ns))
            else {
                return Err(Decline::SegmentTime);
            };
            let segment_id = segment_span_id(written.trace_id, written.span_id, &segment.name);
            put_segment_span(&mut group.spans, written, member, &segment_id, &segment.name, start, end);
            let mut attributes_json = String::with_capacity(24 + segment.name.len());
            attributes_json.push('{');
            json_string(SEGMENT_ATTRIBUTE, &mut attributes_json);
            attributes_json.push_str(": ");
            json_string(&segment.name, &mut attributes_json);
            attributes_json.push('}');
            group.rows.push(SpanRowOut {
                trace_id: trace_hex.to_owned(),
                span_id: hex(&segment_id),
                parent_span_id: span_hex.to_owned(),
                name: segment.name.to_string(),
                kind: SPAN_KIND_INTERNAL,
                service_name: self.service_name.clone(),
                start_unix_ns: start.min(INT64_MAX) as i64,
                end_unix_ns: end.min(INT64_MAX) as i64,
                status_code: 0,
                status_message: String::new(),
                attributes_json,
            });
        }
        Ok(record.segments.len())
    }

    fn scope_spans_size(group: &Group) -> usize {
        delimited_size(group.scope.len()) + group.spans.len()
    }

    fn size(&self) -> usize {
        delimited_size(self.resource.len())
            + self.groups.iter().map(|g| delimited_size(Self::scope_spans_size(g))).sum::<usize>()
    }
}

/// The last record of each span id, as `kept_trace`'s dict keeps it: a trace's few records searched
/// from the last, more by a map.
enum BySpan<'r, 't> {
    Few(&'r [Record<'t>]),
    Many(HashMap<SpanId, &'r Record<'t>>),
}

impl<'r, 't> BySpan<'r, 't> {
    const FEW: usize = 16;

    fn new(records: &'r [Record<'t>]) -> BySpan<'r, 't> {
        if records.len() <= Self::FEW {
            BySpan::Few(records)
        } else {
            BySpan::Many(records.iter().map(|r| (r.span_id, r)).collect())
        }
    }

    fn get(&self, span_id: &SpanId) -> Option<&'r Record<'t>> {
        match self {
            BySpan::Few(records) => records.iter().rev().find(|r| r.span_id == *span_id),
            BySpan::Many(records) => records.get(span_id).copied(),
        }
    }
}

/// What writing a span leaves for its segment spans: its ids as the span says them.
struct Written<'p> {
    trace_id: &'p [u8],
    span_id: &'p [u8],
}

/// The kept-trace writer: `kept_trace` under one `Redaction`. Each key's class is remembered
/// (bounded, as `Redaction._key_classes`).
#[derive(Debug)]
pub struct KeptWriter {
    rules: Rules,
    origins: OriginCache,
}

/// A resource or a scope through the rules (`strip_attributes`): its new bytes, its service name
/// (a resource's), and what the rules removed of it.
#[derive(Debug)]
struct Stripped {
    bytes: Vec<u8>,
    service_name: String,
    counts: RedactionCounts,
}

/// The resources and scopes stripped lately, by their bytes: a process's resource is the same in
/// every trace it sends, and stripping it is a pure function of its bytes and the settings, so each
/// is stripped once (its counts added to every trace it is in, as Python strips it per trace).
/// Bounded: cleared when full (resources are the sender's).
#[derive(Debug, Default)]
struct OriginCache {
    resources: HashMap<Vec<u8>, Stripped, foldhash::fast::RandomState>,
    scopes: HashMap<Vec<u8>, Stripped, foldhash::fast::RandomState>,
}

impl OriginCache {
    const LIMIT: usize = 256;

    fn resource(&mut self, rules: &mut Rules, bytes: &[u8]) -> Result<&Stripped, Decline> {
        Self::stripped(&mut self.resources, bytes, || {
            validate(bytes, 0, bytes.len(), Msg::Resource, 1)?;
            let mut counts = RedactionCounts::default();
            let stripped = span::rewrite_resource(rules, bytes, &mut counts)?;
            Ok(Stripped { bytes: stripped, service_name: span::service_name(bytes)?, counts })
        })
    }

    fn scope(&mut self, rules: &mut Rules, bytes: &[u8]) -> Result<&Stripped, Decline> {
        Self::stripped(&mut self.scopes, bytes, || {
            validate(bytes, 0, bytes.len(), Msg::Scope, 1)?;
            let mut counts = RedactionCounts::default();
            let stripped = span::rewrite_scope(rules, bytes, &mut counts)?;
            Ok(Stripped { bytes: stripped, service_name: String::new(), counts })
        })
    }

    fn stripped<'c>(cache: &'c mut HashMap<Vec<u8>, Stripped, foldhash::fast::RandomState>, bytes: &[u8],
                    strip: impl FnOnce() -> Result<Stripped, Decline>) -> Result<&'c Stripped, Decline> {
        if !cache.contains_key(bytes) {
            let stripped = strip()?;
            if cache.len() >= Self::LIMIT {
                cache.clear();
            }
            cache.insert(bytes.to_vec(), stripped);
        }
        cache.get(bytes).ok_or(Decline::Malformed)
    }
}

impl KeptWriter {
    /// The writer for `redaction`; an error for a setting it does not match Python on (a glob
    /// with a character class): the binding then keeps Python's writer.
    pub fn new(redaction: &Redaction) -> Result<KeptWriter, String> {
        Ok(KeptWriter { rules: Rules::new(redaction)?, origins: OriginCache::default() })
    }

    /// `kept_trace(spans, records, policy, threshold, redaction)`: `policy` is the decision's
    /// policy name, `threshold` its OTel threshold (`Names::name` of the decision's ids).
    pub fn write(&mut self, trace: &TraceData, records: &[Record<'_>], policy: &str, threshold: &str)
                 -> Result<KeptOut, Decline> {
        if trace.origins.len() >= u16::MAX as usize {
            return Err(Decline::Origins);
        }
        let by_span = BySpan::new(records);
        let member = if threshold.is_empty() || threshold == "0" { String::new() } else { format!("ot=th:{threshold}") };
        let mut counts = RedactionCounts::default();
        let mut groups = Groups { resources: Vec::new(), by_bytes: HashMap::new(), by_origin: vec![None; trace.origins.len()] };
        let mut spans = 0usize;
        for at in 0..trace.len() {
            let (resource_at, group_at) = self.group_of(trace, at, &mut groups, &mut counts)?;
            let payload = trace.payload(at);
            let resource = &mut groups.resources[resource_at];
            let (row, written, record) = self.write_span(&payload, &member, &by_span, policy, &resource.service_name,
                                                         &mut counts, &mut resource.groups[group_at].spans)?;
            spans += 1;
            let (trace_hex, span_hex) = (row.trace_id.clone(), row.span_id.clone());
            resource.groups[group_at].rows.push(row);
            if let Some(record) = record.filter(|r| !r.segments.is_empty()) {
                spans += resource.write_segments(record, &written, &member, &trace_hex, &span_hex)?;
            }
        }
        // The request written once, each message's length known before it.
        let total: usize = groups.resources.iter().map(|r| delimited_size(r.size())).sum();
        let mut request = Vec::with_capacity(total);
        let mut rows = Vec::with_capacity(spans);
        for resource in groups.resources {
            put_header(&mut request, 0x0a, resource.size());
            put_delimited(&mut request, 0x0a, &resource.resource);
            for group in resource.groups {
                put_header(&mut request, 0x12, ResourceGroup::scope_spans_size(&group));
                put_delimited(&mut request, 0x0a, &group.scope);
                request.extend_from_slice(&group.spans);
                rows.extend(group.rows);
            }
        }
        debug_assert_eq!(request.len(), total);
        Ok(KeptOut { request, rows, spans, redacted: counts })
    }

    /// `write` for the engine's decision: its policy and threshold are the names `names` holds for them.
    pub fn write_decision(&mut self, trace: &TraceData, records: &[Record<'_>], decision: &Decision, names: &Names)
                          -> Result<KeptOut, Decline> {
        self.write(trace, records, names.name(decision.policy), names.name(decision.threshold))
    }

    /// The resource and the scope group span `at` is written in, made (stripped, `strip_attributes`)
    /// where its origin is first met, in the order `kept_trace` adds them.
    fn group_of<'d>(&mut self, trace: &'d TraceData, at: usize, groups: &mut Groups<'d>, counts: &mut RedactionCounts)
                    -> Result<(usize, usize), Decline> {
        let origin = trace.span(at).origin as usize;
        if let Some(known) = groups.by_origin.get(origin).copied().flatten() {
            return Ok(known);
        }
        let resource_bytes = trace.resource(at);
        let resource_at = match groups.by_bytes.get(resource_bytes) {
            Some(&index) => index,
            None => {
                let stripped = self.origins.resource(&mut self.rules, resource_bytes)?;
                counts.add(&stripped.counts);
                groups.resources.push(ResourceGroup {
                    resource: stripped.bytes.clone(),
                    service_name: stripped.service_name.clone(),
                    groups: Vec::new(),
                    synthesized: None,
                });
                groups.by_bytes.insert(resource_bytes, groups.resources.len() - 1);
                groups.resources.len() - 1
            }
        };
        let stripped = self.origins.scope(&mut self.rules, trace.scope(at))?;
        counts.add(&stripped.counts);
        let scope_groups = &mut groups.resources[resource_at].groups;
        scope_groups.push(Group { scope: stripped.bytes.clone(), spans: Vec::new(), rows: Vec::new() });
        let known = (resource_at, scope_groups.len() - 1);
        if let Some(slot) = groups.by_origin.get_mut(origin) {
            *slot = Some(known);
        }
        Ok(known)
    }

    /// One span of the trace: parsed, redacted (`Redaction.apply_with_values`), its trace state
    /// stamped (`with_trace_state`), enriched (`enrich`) and written to `out` as a `ScopeSpans.spans`
    /// field; its row, its ids, and its record.
    #[allow(clippy::too_many_arguments)]
    fn write_span<'p, 'r, 't>(&mut self, payload: &'p [u8], member: &str, by_span: &BySpan<'r, 't>,
                              policy: &str, service_name: &str, counts: &mut RedactionCounts, out: &mut Vec<u8>)
                              -> Result<(SpanRowOut, Written<'p>, Option<&'r Record<'t>>), Decline> {
        validate(payload, 0, payload.len(), Msg::Span, 1)?;
        let mut parts = span::read_span(payload)?;
        let entries = parts.entries(payload)?;
        let mut keys = DistinctKeys::with_capacity(entries.len());
        let mut classes = Vec::with_capacity(entries.len());
        let mut genai = 0u8;
        for entry in &entries {
            if !keys.insert(entry.key.as_bytes()) {
                return Err(Decline::RepeatedKey);
            }
            let class = self.rules.key_class(entry.key);
            genai |= class;
            classes.push(class & rules::CLASS);
        }
        let limit = if genai & GENAI != 0 { self.rules.max_free_text_bytes } else { 0 };
        let mut attrs: Vec<Attr<'_>> = Vec::with_capacity(entries.len() + 14);
        for (entry, class) in entries.into_iter().zip(classes) {
            match self.rules.removes(entry.value.as_ref(), class, limit, counts) {
                Verdict::Keep => attrs.push(Attr { key: entry.key, shown: Shown::Read(entry.value) }),
                Verdict::KeepReduced(url) => attrs.push(Attr { key: entry.key, shown: Shown::Text(Cow::Owned(url)) }),
                Verdict::Remove => {}
            }
        }
        let children = Children::rewrite(&mut self.rules, payload, &parts, limit, counts)?;
        // `_redact_status`: the message judged as text under its key, after the attributes; removed,
        // it is the span's `error.type` text as kept, else "". A metadata URL's reduction is counted
        // but, as in Python, reduces only the value it judged, never the message.
        if let Some(status) = parts.status.as_mut().filter(|s| !s.message.is_empty()) {
            let message = Value::Str(&status.message);
            if self.rules.removes(Some(&message), self.rules.status_class, limit, counts) == Verdict::Remove {
                let error_type = attrs.iter().find(|a| a.key == self.rules.error_type_key).map_or("", Attr::text);
                status.message = Cow::Owned(error_type.to_owned());
            }
        }
        if !member.is_empty() {
            let mut stamped = member.to_owned();
            for kept in parts.trace_state.split(',').filter(|m| !m.is_empty() && !m.starts_with("ot=")) {
                stamped.push(',');
                stamped.push_str(kept);
            }
            parts.trace_state = Cow::Owned(stamped);
        }
        let record = <[u8; 8]>::try_from(parts.span_id).ok().and_then(|id| by_span.get(&id));
        if let Some(record) = record {
            enrich(&mut attrs, record, policy);
        }
        parts.put(out, payload, &attrs, &children);
        let mut attributes_json = String::with_capacity(2 + 40 * attrs.len());
        attributes_json.push('{');
        for (index, attr) in attrs.iter().enumerate() {
            if index > 0 {
                attributes_json.push_str(", ");
            }
            json_string(attr.key, &mut attributes_json);
            attributes_json.push_str(": ");
            attr.json(&mut attributes_json);
        }
        attributes_json.push('}');
        let (status_code, status_message) = match &parts.status {
            Some(status) => (status.code, status.message.to_string()),
            None => (0, String::new()),
        };
        let row = SpanRowOut {
            trace_id: hex(parts.trace_id),
            span_id: hex(parts.span_id),
            parent_span_id: hex(parts.parent_span_id),
            name: parts.name.to_owned(),
            kind: parts.kind,
            service_name: service_name.to_owned(),
            start_unix_ns: parts.start.min(INT64_MAX) as i64,
            end_unix_ns: parts.end.min(INT64_MAX) as i64,
            status_code,
            status_message,
            attributes_json,
        };
        Ok((row, Written { trace_id: parts.trace_id, span_id: parts.span_id }, record))
    }
}

/// `synthesis.enrich`: the bridge attributes beside the engine's own, each set where its key is
/// (the first position of it) or appended: only what a span said or the configured model mapping
/// gave, never a configured default.
fn enrich<'a>(attrs: &mut Vec<Attr<'a>>, record: &'a Record<'_>, policy: &'a str) {
    let mut set = |key: &'static str, shown: Shown<'a>| match attrs.iter_mut().find(|a| a.key == key) {
        Some(existing) => existing.shown = shown,
        None => attrs.push(Attr { key, shown }),
    };
    let text = |text: &'a str| Shown::Text(Cow::Borrowed(text));
    if !policy.is_empty() {
        set(POLICY_ATTRIBUTE, text(policy));
    }
    set("otel_llm.outcome", text(&record.outcome));
    set("otel_llm.model_source", text(&record.model_source)); // which rule fired, "none" or "default" included
    if record.side == Side::Client {
        return; // a client span already carries its own gen_ai attributes
    }
    if let Some(tokens) = record.prompt_tokens {
        set("gen_ai.usage.input_tokens", Shown::Read(Some(Value::Int(tokens))));
    }
    if let Some(tokens) = record.completion_tokens {
        set("gen_ai.usage.output_tokens", Shown::Read(Some(Value::Int(tokens))));
    }
    if !record.provider_name.is_empty() {
        set("gen_ai.provider.name", text(&record.provider_name));
    }
    if record.operation_source != DEFAULT_SOURCE {
        set("gen_ai.operation.name", text(&record.operation_name));
    }
    if !record.request_model.is_empty() {
        set("gen_ai.request.model", text(&record.request_model));
    }
    if let Some(tpot) = record.tpot_s {
        set("otel_llm.time_per_output_token", Shown::Read(Some(Value::Double(tpot))));
    }
    // What the engine did not measure for this request, and what was derived rather than measured.
    for (key, names) in [("otel_llm.segments_missing", &record.segments_missing),
                         ("otel_llm.segments_derived", &record.segments_derived),
                         ("otel_llm.not_measurable", &record.not_measurable)] {
        if !names.is_empty() {
            set(key, Shown::Text(Cow::Owned(names.join(","))));
        }
    }
    if let Some(overhead) = record.gateway_overhead_s {
        set("otel_llm.gateway_overhead", Shown::Read(Some(Value::Double(overhead))));
    }
    if let Some(overhead) = record.client_overhead_s {
        set("otel_llm.client_overhead", Shown::Read(Some(Value::Double(overhead))));
    }
}

/// A segment span (`add_segment_span`, `with_trace_state`) as upb writes it once `kept_trace`'s
/// fields are merged into the scope: trace id (1), its id (2), the threshold's trace state (3), the
/// engine span as parent (4), name (5), kind INTERNAL (6), times (7, 8: left out when 0), its
/// segment attribute (9). Ids the engine span has empty are left out, as upb leaves them.
fn put_segment_span(out: &mut Vec<u8>, written: &Written<'_>, member: &str, segment_id: &[u8; 8], name: &str,
                    start: u64, end: u64) {
    let text_size = |data: &[u8]| if data.is_empty() { 0 } else { delimited_size(data.len()) };
    let value_size = delimited_size(name.len()); // the `AnyValue`'s string, written even when ""
    let attribute_size = delimited_size(SEGMENT_ATTRIBUTE.len()) + delimited_size(value_size);
    let size = text_size(written.trace_id) + delimited_size(8) + text_size(member.as_bytes())
        + text_size(written.span_id) + text_size(name.as_bytes()) + 2
        + if start == 0 { 0 } else { 9 } + if end == 0 { 0 } else { 9 } + delimited_size(attribute_size);
    put_header(out, 0x12, size);
    let put_text = |out: &mut Vec<u8>, tag: u8, data: &[u8]| {
        if !data.is_empty() {
            put_delimited(out, tag, data);
        }
    };
    put_text(out, 0x0a, written.trace_id);
    put_delimited(out, 0x12, segment_id);
    put_text(out, 0x1a, member.as_bytes());
    put_text(out, 0x22, written.span_id);
    put_text(out, 0x2a, name.as_bytes());
    out.extend_from_slice(&[0x30, SPAN_KIND_INTERNAL as u8]);
    if start != 0 {
        out.push(0x39);
        out.extend_from_slice(&start.to_le_bytes());
    }
    if end != 0 {
        out.push(0x41);
        out.extend_from_slice(&end.to_le_bytes());
    }
    put_header(out, 0x4a, attribute_size);
    put_delimited(out, 0x0a, SEGMENT_ATTRIBUTE.as_bytes());
    put_header(out, 0x12, value_size);
    put_delimited(out, 0x0a, name.as_bytes());
}

#[cfg(test)]
mod tests;
