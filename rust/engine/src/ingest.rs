//! One export request read into the spans the buffer takes: `processor/llm_metrics/digest.py`'s
//! adapter stage (`_digest`) on the request's bytes, without a protobuf object or a Python value.
//!
//! A request is read here whole or not at all: where one of its spans needs a Python step (over an
//! attribute limit, a repeated key, a value the shape table's native reading hands to Python, a
//! sampling threshold to check, a value `derive_timings` refuses — Python names the refusal), the
//! request is Python's (`Ingested::Python`), which reads it with the reference digest and hands the
//! spans over; every span of a request then enters the buffer in the request's order either way.

use crate::model::{FieldId, Kind, NewSpan, Observation, Schema, SpanId, TraceId, ValueRef};
use crate::shapes::{Attributes, Reading, ShapeTable, SpanFacts};
use crate::wire::{scan, utf8, Malformed, Origin, Reader, SpanRow};

/// `digest.AttributeLimits` and the bounds `segments.derive_timings` checks at intake.
#[derive(Clone, Debug)]
pub struct IngestSettings {
    pub max_attributes: usize,
    pub max_value_bytes: usize,
    pub max_latency_s: f64,
    pub max_tokens: i64,
    pub abs_tolerance_s: f64,
    pub rel_tolerance: f64,
}

/// A span read from a request, ready for the buffer (`RequestRead::new_span` makes its `NewSpan`).
pub struct Incoming<'d> {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub kind: i32,
    pub status_code: i32,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub payload: &'d [u8],
    pub trace_state: &'d str,
    pub resource_index: usize,
    pub scope_index: usize,
    /// The observation's shape (an index of the shape table), where an adapter read one.
    pub shape: Option<usize>,
    pub observation: Option<Observation>,
    /// Assembly may read the span's attributes (`SpanSlot::attrs_kept`).
    pub attrs_kept: bool,
}

/// A request's spans and their origins.
pub struct RequestRead<'d> {
    pub origins: Vec<Origin>,
    /// Each resource's `service.name` (`unknown_service` without one).
    pub service_names: Vec<String>,
    pub spans: Vec<Incoming<'d>>,
    pub counts: IngestCounts,
}

impl<'d> RequestRead<'d> {
    /// The `at`-th span as the buffer takes it.
    pub fn new_span(&self, at: usize) -> NewSpan<'_> {
        let span = &self.spans[at];
        let origin = &self.origins[span.resource_index];
        NewSpan {
            span_id: span.span_id,
            parent_span_id: span.parent_span_id,
            kind: span.kind,
            status_code: span.status_code,
            start_unix_ns: span.start_unix_ns,
            end_unix_ns: span.end_unix_ns,
            payload: span.payload,
            trace_state: span.trace_state,
            resource: &origin.resource,
            scope: origin.scopes.get(span.scope_index).map_or(&[], Vec::as_slice),
            service_name: &self.service_names[span.resource_index],
            observation: span.observation.as_ref(),
            attrs_kept: span.attrs_kept,
        }
    }
}

/// What reading a request counted, as `DigestCounts` (per request: a labelled counter is touched
/// once per request, not once per span).
#[derive(Debug, Default, PartialEq)]
pub struct IngestCounts {
    /// (shape, spans) for each shape that matched.
    pub matched: Vec<(usize, u64)>,
    /// (reason, service name, spans) refused.
    pub malformed: Vec<(String, String, u64)>,
    pub passed_through: u64,
    /// Spans whose ids the receivers refuse (a request that did not pass their check: a hand-over,
    /// a replay): not buffered, counted.
    pub invalid_ids: u64,
}

impl IngestCounts {
    fn matched(&mut self, shape: usize) {
        match self.matched.iter_mut().find(|(s, _)| *s == shape) {
            Some((_, n)) => *n += 1,
            None => self.matched.push((shape, 1)),
        }
    }

    fn malformed(&mut self, reason: String, service: &str) {
        match self.malformed.iter_mut().find(|(r, s, _)| *r == reason && s == service) {
            Some((_, _, n)) => *n += 1,
            None => self.malformed.push((reason, service.to_owned(), 1)),
        }
    }
}

pub enum Ingested<'d> {
    Native(RequestRead<'d>),
    /// Python reads this request (see the module's doc).
    Python,
}

/// The observation fields `derive_timings` checks at intake, looked up by name once.
#[derive(Clone, Debug)]
pub struct Checked {
    latencies: Vec<FieldId>,
    prompt: FieldId,
    completion: FieldId,
    ttft: FieldId,
    e2e: FieldId,
}

impl Checked {
    pub fn new(schema: &Schema) -> Result<Checked, String> {
        let mut latencies = Vec::new();
        for name in ["ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s", "preprocess_s", "tpot_s"] {
            latencies.push(schema.require(name, Kind::Float)?);
        }
        Ok(Checked {
            latencies,
            prompt: schema.require("prompt_tokens", Kind::Int)?,
            completion: schema.require("completion_tokens", Kind::Int)?,
            ttft: schema.require("ttft_s", Kind::Float)?,
            e2e: schema.require("e2e_s", Kind::Float)?,
        })
    }

    /// True when `derive_timings` cannot refuse these values: every latency in [0, max] and
    /// finite, every token count in [0, max], TTFT within e2e's tolerance. (Adapters read here derive
    /// no prefill or decode.) False sends the request to Python, which names the refusal.
    fn passes(&self, observation: &Observation, settings: &IngestSettings) -> bool {
        let float = |id: FieldId| match observation.get(id) {
            Some(ValueRef::Float(v)) => Some(v),
            _ => None,
        };
        let int = |id: FieldId| match observation.get(id) {
            Some(ValueRef::Int(v)) => Some(v),
            _ => None,
        };
        let latencies_ok = self.latencies.iter().filter_map(|id| float(*id))
            .all(|v| (0.0..=settings.max_latency_s).contains(&v) && v != f64::INFINITY);
        let tokens_ok = [int(self.prompt), int(self.completion)].iter().flatten()
            .all(|t| (0..=settings.max_tokens).contains(t));
        let consistent = match (float(self.ttft), float(self.e2e)) {
            (Some(ttft), Some(e2e)) => ttft <= e2e + (settings.abs_tolerance_s + settings.rel_tolerance * e2e),
            _ => true,
        };
        latencies_ok && tokens_ok && consistent
    }
}

/// Reads the export request `data` (`validated`: the receivers validated these very bytes).
pub fn read_request<'d>(data: &'d [u8], validated: bool, table: &ShapeTable, checked: &Checked,
                        settings: &IngestSettings) -> Result<Ingested<'d>, Malformed> {
    let (origins, rows) = scan(data, validated)?;
    for origin in &origins {
        if resource_over_limits(&origin.resource, settings)? {
            return Ok(Ingested::Python);
        }
    }
    let service_names: Vec<String> = origins.iter().map(|o| service_name(&o.resource)).collect();
    let mut counts = IngestCounts::default();
    let mut spans = Vec::with_capacity(rows.len());
    let mut attrs: Attributes = Vec::with_capacity(32);
    for row in &rows {
        if row.duplicate_keys || row.payload.1 - row.payload.0 > settings.max_value_bytes
            || row.attributes > settings.max_attributes {
            return Ok(Ingested::Python);
        }
        let Some((trace_id, span_id, parent)) = ids(data, row) else {
            counts.invalid_ids += 1;
            continue;
        };
        let name = utf8(&data[row.name.0..row.name.1])?;
        let service_name = &service_names[row.resource_index];
        let facts = SpanFacts {
            data, start: row.payload.0, end: row.payload.1, kind: row.kind, name, status_code: row.status_code,
            events: row.events, duplicate_keys: row.duplicate_keys,
        };
        let (shape, observation, attrs_kept) = match table.read(&facts, &mut attrs) {
            Reading::Python => return Ok(Ingested::Python),
            Reading::NotCandidate => {
                counts.passed_through += 1;
                (None, None, false)
            }
            Reading::Unclaimed | Reading::NoObservation => {
                counts.passed_through += 1;
                (None, None, true)
            }
            Reading::Malformed(reason) => {
                counts.malformed(reason, service_name);
                counts.passed_through += 1;
                // As `_digest`: a refused span keeps none of its attributes for assembly.
                (None, None, false)
            }
            Reading::Observed { shape, observation, reads_attributes } => {
                let part = !table.shapes[shape].info.part.is_empty();
                if !part {
                    if !checked.passes(&observation, settings) {
                        return Ok(Ingested::Python);
                    }
                    let trace_state = &data[row.trace_state.0..row.trace_state.1];
                    // A sampling threshold's weight is checked by Python (`adjusted_count`).
                    if trace_state.windows(3).any(|w| w == b"th:") {
                        return Ok(Ingested::Python);
                    }
                }
                counts.matched(shape);
                (Some(shape), Some(observation), reads_attributes)
            }
        };
        spans.push(Incoming {
            trace_id,
            span_id,
            parent_span_id: parent,
            kind: row.kind,
            status_code: row.status_code,
            start_unix_ns: row.start_unix_ns,
            end_unix_ns: row.end_unix_ns,
            payload: &data[row.payload.0..row.payload.1],
            trace_state: utf8(&data[row.trace_state.0..row.trace_state.1])?,
            resource_index: row.resource_index,
            scope_index: row.scope_index,
            shape,
            observation,
            attrs_kept,
        });
    }
    Ok(Ingested::Native(RequestRead { origins, service_names, spans, counts }))
}

/// The ids the receivers admit (`admission.valid_ids`): a 16-byte trace id and an 8-byte span id,
/// neither all zeros, and a parent id that is empty or 8 bytes.
fn ids(data: &[u8], row: &SpanRow) -> Option<(TraceId, SpanId, Option<SpanId>)> {
    let trace_id: TraceId = data[row.trace_id.0..row.trace_id.1].try_into().ok()?;
    let span_id: SpanId = data[row.span_id.0..row.span_id.1].try_into().ok()?;
    if trace_id.iter().all(|b| *b == 0) || span_id.iter().all(|b| *b == 0) {
        return None;
    }
    let parent = &data[row.parent_span_id.0..row.parent_span_id.1];
    let parent = match parent.len() {
        0 => None,
        8 => Some(parent.try_into().ok()?),
        _ => return None,
    };
    Some((trace_id, span_id, parent))
}

/// `AttributeLimits.enforce_resource`'s test: more attributes than allowed, or more bytes.
fn resource_over_limits(resource: &[u8], settings: &IngestSettings) -> Result<bool, Malformed> {
    if resource.len() > settings.max_value_bytes {
        return Ok(true);
    }
    let mut reader = Reader::new(resource, 0, resource.len());
    let mut attributes = 0;
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        if number == 1 && wire_type == 2 {
            attributes += 1;
        }
        reader.skip(number, wire_type, 0)?;
    }
    Ok(attributes > settings.max_attributes)
}

/// `service.name` of a resource as `digest._strings_of` reads it: its string value, else
/// "unknown_service" (the last of repeated keys, as the resource's map).
pub fn service_name(resource: &[u8]) -> String {
    resource_string(resource, "service.name").filter(|s| !s.is_empty()).unwrap_or_else(|| "unknown_service".to_owned())
}

/// A resource attribute's string value (the last occurrence of its key).
pub fn resource_string(resource: &[u8], key: &str) -> Option<String> {
    let mut reader = Reader::new(resource, 0, resource.len());
    let mut found = None;
    while !reader.done() {
        let (number, wire_type) = reader.tag().ok()?;
        if number != 1 || wire_type != 2 {
            reader.skip(number, wire_type, 0).ok()?;
            continue;
        }
        let (s, e) = reader.delimited().ok()?;
        // Only string values count, the last one winning (`digest._strings_of`'s dict of them).
        if crate::wire::entry_key(resource, s, e).ok()? == key.as_bytes() {
            if let crate::model::AnyValue::Str(text) = crate::model::entry_value(&resource[s..e]) {
                found = Some(text.to_owned());
            }
        }
    }
    found
}
