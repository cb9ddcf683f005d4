//! The engine's two hand-offs with Python, as plain data the binding makes from (and into) plain
//! Python tuples: no Python type here, and nothing the binding has to know of the engine's arenas.
//!
//! 1. **Supply** (`Engine::supply`): a request the engine left to Python (`IngestSummary::Python`)
//!    is read by the reference digest (`processor/llm_metrics/digest.py` `digest_in_process`), and
//!    what it made per span (`pdata/spans.py` `BufferedSpan`) is handed over as `SpansData`: the
//!    engine buffers those spans exactly as if it had read them. A span's fields are
//!    `BufferedSpan`'s, in its order; its origin is an index into the request's origins (as
//!    `digest._digest(portable=True)` sends them), its attributes as the one flag assembly needs
//!    (`attrs_kept`: Python's `attrs` tuple is what the engine reads off the payload where the flag
//!    is set), and its observation as (adapter, [(field name, value)]): the adapter names the shape
//!    (`ShapeInfo::adapter`, one per shape), the fields are the shape table's `FIELDS` by name,
//!    converted through the engine's `Schema` by name, never by position. Where the payload was
//!    re-serialized after the attribute limits (`AttributeLimits.enforce`), the bytes buffered are
//!    Python's, so the request's own bytes are not needed (nor read).
//! 2. **Read back** (`spans_of`, `Engine::spans_of`): the spans of a trace the engine holds (a
//!    declined completion's, a kept trace the writer declined) as the same `SpansData`, so Python
//!    rebuilds its `BufferedSpan`s (`Origin` from the resource and scope bytes, `attrs` from the
//!    payload where `attrs_kept`, `EngineObservation` from the adapter's shape and the fields) and
//!    runs its reference chain on them. `supply(spans_of(trace))` buffers the trace again as it was.

use std::fmt;

use crate::model::{FieldId, Kind, Observation, Schema, ShapeInfo, SpanId, TraceData, TraceId, Value};

/// Where spans came from (`pdata/spans.py` `Origin`, serialized): the resource's and the scope's
/// bytes (as Python buffered them: a resource over the limits trimmed) and the resource's
/// `service.name` as `digest._strings_of` read it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OriginData {
    pub resource: Vec<u8>,
    pub scope: Vec<u8>,
    pub service_name: String,
}

/// An observation by names (`EngineObservation`): its adapter (the shape's name: engine kind,
/// part and `may_be_gateway` come with it) and its present fields (a `None` attribute is no entry),
/// each of the kind the schema declares (`Kind`: float, int, text, flag, floats, texts).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservationData {
    pub adapter: String,
    pub fields: Vec<(String, Value)>,
}

/// One span (`BufferedSpan`'s fields, in its order). Ids as bytes, as Python holds them: a trace id
/// of 16 bytes, a span id of 8, a parent id of 8 or none (empty); other ids are counted
/// (`IngestCounts::invalid_ids`) and not buffered, as `ingest` counts them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpanData {
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Vec<u8>,
    pub kind: i32,
    pub status_code: i32,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub trace_state: String,
    /// The span's bytes as buffered (a `Span` message; Python's, re-serialized after truncation).
    pub payload: Vec<u8>,
    /// Its origin: an index of `SpansData::origins`.
    pub origin: usize,
    /// Assembly reads the span's attributes (`SpanSlot::attrs_kept`). From Python: `attrs` holds a
    /// key other than `FIRST_TOKEN_EVENT` (where it holds none, no key Python keeps is in the
    /// payload, so `TraceData::attr` finds none either; the first-token event is read off the
    /// payload's events). Read back: the engine's flag, which is wider (a candidate's, whatever keys).
    pub attrs_kept: bool,
    pub observation: Option<ObservationData>,
}

/// Spans and the origins they refer to: a request's (supplied) or a trace's (read back).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpansData {
    pub origins: Vec<OriginData>,
    pub spans: Vec<SpanData>,
}

/// Why a supply was refused (nothing of it buffered): each names the span (its position in
/// `SpansData::spans`) and what of it the engine cannot take.
#[derive(Clone, Debug, PartialEq)]
pub enum SupplyError {
    /// The span's origin index is not one of the origins supplied.
    Origin { span: usize, origin: usize, origins: usize },
    /// No shape of the engine's table has this adapter name.
    Adapter { span: usize, adapter: String },
    /// The schema declares no field of this name.
    Field { span: usize, adapter: String, field: String },
    /// The field is declared of another kind than the value given.
    Kind { span: usize, field: String, declared: Kind, given: Kind },
    /// The field is given twice.
    Twice { span: usize, field: String },
}

impl fmt::Display for SupplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SupplyError::Origin { span, origin, origins } =>
                write!(f, "span {span}: origin {origin} is not one of the {origins} origins supplied"),
            SupplyError::Adapter { span, adapter } =>
                write!(f, "span {span}: no shape has the adapter {adapter:?}"),
            SupplyError::Field { span, adapter, field } =>
                write!(f, "span {span} ({adapter}): no observation field {field:?} is declared"),
            SupplyError::Kind { span, field, declared, given } =>
                write!(f, "span {span}: field {field:?} is declared {declared:?}, given {given:?}"),
            SupplyError::Twice { span, field } => write!(f, "span {span}: field {field:?} given twice"),
        }
    }
}

impl std::error::Error for SupplyError {}

/// The ids of a supplied span as the receivers admit them (`admission.valid_ids`, as `ingest::ids`):
/// `None` for ids they refuse.
pub(crate) fn ids_of(span: &SpanData) -> Option<(TraceId, SpanId, Option<SpanId>)> {
    let trace_id: TraceId = span.trace_id.as_slice().try_into().ok()?;
    let span_id: SpanId = span.span_id.as_slice().try_into().ok()?;
    if trace_id.iter().all(|b| *b == 0) || span_id.iter().all(|b| *b == 0) {
        return None;
    }
    let parent = match span.parent_span_id.len() {
        0 => None,
        8 => Some(span.parent_span_id.as_slice().try_into().ok()?),
        _ => return None,
    };
    Some((trace_id, span_id, parent))
}

/// The observation `data` names, in the engine's terms: its shape by adapter name, each field by
/// name and checked against the kind the schema declares. `span` names the span in an error.
pub fn observation_of(data: &ObservationData, schema: &Schema, infos: &[ShapeInfo], span: usize)
                      -> Result<Observation, SupplyError> {
    let shape = infos.iter().position(|info| info.adapter == data.adapter)
        .ok_or_else(|| SupplyError::Adapter { span, adapter: data.adapter.clone() })?;
    let mut observation = Observation::new(shape as u16);
    for (name, value) in &data.fields {
        let id: FieldId = schema.id(name)
            .ok_or_else(|| SupplyError::Field { span, adapter: data.adapter.clone(), field: name.clone() })?;
        let declared = schema.kind(id);
        if value.kind() != declared {
            return Err(SupplyError::Kind { span, field: name.clone(), declared, given: value.kind() });
        }
        if observation.get(id).is_some() {
            return Err(SupplyError::Twice { span, field: name.clone() });
        }
        observation.set(id, value.clone());
    }
    Ok(observation)
}

/// The observation's names: its adapter and its present fields, in field order (`None` for a
/// shape the table does not hold, which no observation of this engine's has).
pub fn observation_data(observation: &Observation, schema: &Schema, infos: &[ShapeInfo]) -> Option<ObservationData> {
    let info = infos.get(observation.shape as usize)?;
    debug_assert!(observation.values.iter().all(|(id, _)| (id.0 as usize) < schema.len()));
    Some(ObservationData {
        adapter: info.adapter.clone(),
        fields: observation.values.iter().filter(|(id, _)| (id.0 as usize) < schema.len())
            .map(|(id, value)| (schema.name(*id).to_owned(), value.clone())).collect(),
    })
}

/// Every span of `trace`, in the trace's order, with its bytes (`TraceData::payload`: as received),
/// its origin and its observation by names; the origins each once, in the order spans first refer
/// to them. `schema` and `infos` are the ones the trace's observations were made with (the engine's).
pub fn spans_of(trace: &TraceData, schema: &Schema, infos: &[ShapeInfo]) -> SpansData {
    let mut out = SpansData { origins: Vec::new(), spans: Vec::with_capacity(trace.len()) };
    // The trace's origin slot -> its index in `out.origins`.
    let mut seen: Vec<(u16, usize)> = Vec::new();
    for at in 0..trace.len() {
        let slot = trace.span(at);
        let origin = match seen.iter().find(|(o, _)| *o == slot.origin) {
            Some((_, index)) => *index,
            None => {
                out.origins.push(OriginData {
                    resource: trace.resource(at).to_vec(),
                    scope: trace.scope(at).to_vec(),
                    service_name: trace.service_name(at).to_owned(),
                });
                seen.push((slot.origin, out.origins.len() - 1));
                out.origins.len() - 1
            }
        };
        out.spans.push(SpanData {
            trace_id: trace.trace_id.to_vec(),
            span_id: slot.span_id.to_vec(),
            parent_span_id: slot.parent().map_or_else(Vec::new, |p| p.to_vec()),
            kind: slot.kind,
            status_code: slot.status_code,
            start_unix_ns: slot.start_unix_ns,
            end_unix_ns: slot.end_unix_ns,
            trace_state: trace.trace_state(at).to_owned(),
            payload: trace.payload(at),
            origin,
            attrs_kept: slot.attrs_kept,
            observation: trace.observation(at, schema).and_then(|o| observation_data(&o, schema, infos)),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        Schema::new(vec![("ttft_s".into(), Kind::Float), ("prompt_tokens".into(), Kind::Int),
                         ("itl_s".into(), Kind::Floats), ("response_model".into(), Kind::Text)]).unwrap()
    }

    fn infos() -> Vec<ShapeInfo> {
        vec![ShapeInfo { adapter: "a".into(), engine_kind: "a".into(), ..ShapeInfo::default() },
             ShapeInfo { adapter: "vllm_v1".into(), engine_kind: "vllm".into(), ..ShapeInfo::default() }]
    }

    #[test]
    fn an_observation_by_names_lands_in_its_fields_and_back() {
        let (schema, infos) = (schema(), infos());
        let data = ObservationData { adapter: "vllm_v1".into(), fields: vec![
            ("itl_s".into(), Value::Floats(vec![0.01, 0.02])),
            ("ttft_s".into(), Value::Float(0.25)),
            ("response_model".into(), Value::Text("m".into())),
        ] };
        let observation = observation_of(&data, &schema, &infos, 0).unwrap();
        assert_eq!(observation.shape, 1);
        assert_eq!(observation.get(schema.id("ttft_s").unwrap()), Some(crate::model::ValueRef::Float(0.25)));
        assert_eq!(observation.get(schema.id("prompt_tokens").unwrap()), None);
        let back = observation_data(&observation, &schema, &infos).unwrap();
        // In the schema's field order, whatever order they were given in.
        assert_eq!(back.fields.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["ttft_s", "itl_s", "response_model"]);
        assert_eq!(back.adapter, "vllm_v1");
    }

    #[test]
    fn a_wrong_name_or_kind_is_refused_naming_it() {
        let (schema, infos) = (schema(), infos());
        let with = |adapter: &str, fields: Vec<(&str, Value)>| ObservationData {
            adapter: adapter.into(), fields: fields.into_iter().map(|(n, v)| (n.to_owned(), v)).collect() };
        let err = observation_of(&with("a", vec![("tftt_s", Value::Float(1.0))]), &schema, &infos, 3).unwrap_err();
        assert_eq!(err, SupplyError::Field { span: 3, adapter: "a".into(), field: "tftt_s".into() });
        assert!(err.to_string().contains("\"tftt_s\""), "{err}");
        let err = observation_of(&with("a", vec![("prompt_tokens", Value::Float(1.0))]), &schema, &infos, 0).unwrap_err();
        assert_eq!(err, SupplyError::Kind { span: 0, field: "prompt_tokens".into(), declared: Kind::Int, given: Kind::Float });
        assert!(err.to_string().contains("\"prompt_tokens\""), "{err}");
        let err = observation_of(&with("tgi2", vec![]), &schema, &infos, 0).unwrap_err();
        assert!(err.to_string().contains("\"tgi2\""), "{err}");
        let twice = with("a", vec![("ttft_s", Value::Float(1.0)), ("ttft_s", Value::Float(2.0))]);
        assert_eq!(observation_of(&twice, &schema, &infos, 0).unwrap_err(),
                   SupplyError::Twice { span: 0, field: "ttft_s".into() });
    }

    #[test]
    fn ids_are_admitted_as_the_receivers_admit_them() {
        let span = |t: Vec<u8>, s: Vec<u8>, p: Vec<u8>| SpanData { trace_id: t, span_id: s, parent_span_id: p,
                                                                   ..SpanData::default() };
        assert!(ids_of(&span(vec![1; 16], vec![2; 8], vec![])).is_some());
        assert_eq!(ids_of(&span(vec![1; 16], vec![2; 8], vec![3; 8])).unwrap().2, Some([3; 8]));
        assert!(ids_of(&span(vec![1; 15], vec![2; 8], vec![])).is_none());
        assert!(ids_of(&span(vec![0; 16], vec![2; 8], vec![])).is_none());
        assert!(ids_of(&span(vec![1; 16], vec![0; 8], vec![])).is_none());
        assert!(ids_of(&span(vec![1; 16], vec![2; 8], vec![3; 4])).is_none());
    }
}
