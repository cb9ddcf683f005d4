//! A request's record: one per LLM request and side, the single input of every metric, sampling
//! policy and store row (`otel_llm/pdata/records.py` `RequestRecord`, whose fields this mirrors by
//! name: the binding maps each declared field to a `RecordField` once, at construction).
//!
//! Texts borrow from the trace they were read from (or from the configuration) while the trace is
//! completed; a record Python built (a shape only Python reads) owns its texts.

use std::borrow::Cow;

use crate::model::{FieldId, SpanId, TraceId, Value, ValueRef};

pub type Text<'a> = Cow<'a, str>;

/// `pdata.records.Side`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Server,
    Client,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Server => "server",
            Side::Client => "client",
        }
    }

    pub fn parse(text: &str) -> Option<Side> {
        match text {
            "server" => Some(Side::Server),
            "client" => Some(Side::Client),
            _ => None,
        }
    }
}

/// `pdata.records.Outcome`'s values.
pub mod outcome {
    pub const STOP: &str = "stop";
    pub const LENGTH: &str = "length";
    pub const ABORT: &str = "abort";
    pub const ERROR: &str = "error";
    pub const UNKNOWN: &str = "unknown";

    /// `Outcome.FAILED`: a request that did not succeed (TTFT and TPOT are not observed for it).
    pub fn failed(outcome: &str) -> bool {
        outcome == ABORT || outcome == ERROR
    }
}

/// A timed part of a request (`pdata.records.Segment`).
#[derive(Clone, Debug, PartialEq)]
pub struct Segment<'a> {
    pub name: Text<'a>,
    pub start_unix_ns: i64,
    pub end_unix_ns: i64,
}

impl Segment<'_> {
    pub fn duration_s(&self) -> f64 {
        (self.end_unix_ns - self.start_unix_ns) as f64 / 1e9
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Record<'a> {
    pub trace_id: TraceId,
    /// The engine span, or the edge span of a request that never reached an engine.
    pub span_id: SpanId,
    pub engine_kind: Text<'a>,
    pub adapter: Text<'a>,
    pub service_name: Text<'a>,
    pub model: Text<'a>,
    pub model_source: Text<'a>,
    pub request_model: Text<'a>,
    pub response_model: Text<'a>,
    pub operation_name: Text<'a>,
    pub provider_name: Text<'a>,
    pub outcome: Text<'a>,
    pub side: Side,
    pub operation_source: Text<'a>,
    pub error_type: Text<'a>,
    pub server_address: Text<'a>,
    pub server_port: Text<'a>,
    pub start_unix_ns: i64,
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub queue_s: Option<f64>,
    pub prefill_s: Option<f64>,
    pub decode_s: Option<f64>,
    pub inference_s: Option<f64>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub gateway_overhead_s: Option<f64>,
    pub client_overhead_s: Option<f64>,
    pub edge_ttft_s: Option<f64>,
    pub edge_span_id: Option<SpanId>,
    pub joined_span_id: Option<SpanId>,
    pub segments: Vec<Segment<'a>>,
    pub dimensions: Vec<Text<'a>>,
    pub weight: f64,
    pub rejected: Vec<Text<'a>>,
    pub segments_missing: Vec<Text<'a>>,
    pub not_measurable: Vec<Text<'a>>,
    pub segments_derived: Vec<Text<'a>>,
    pub cached_tokens: Option<i64>,
    pub cache_write_tokens: Option<i64>,
    pub reasoning_tokens: Option<i64>,
    pub itl_s: Vec<f64>,
    pub tenant: Text<'a>,
    pub spec_accepted_tokens: Option<i64>,
    pub spec_draft_tokens: Option<i64>,
    pub spec_steps: Option<i64>,
    pub lora_adapter: Text<'a>,
    pub lora_base_model: Text<'a>,
    /// Fields declared in Python beyond those above (an engine attribute carried from its
    /// observation field of the same name to the record, read by a metric declared on it), by
    /// their id in the record schema.
    pub extra: Vec<(FieldId, Value)>,
}

impl<'a> Record<'a> {
    /// A record with every field at `RequestRecord`'s default.
    pub fn new(trace_id: TraceId, span_id: SpanId) -> Record<'a> {
        Record {
            trace_id,
            span_id,
            engine_kind: Text::Borrowed(""),
            adapter: Text::Borrowed(""),
            service_name: Text::Borrowed(""),
            model: Text::Borrowed(""),
            model_source: Text::Borrowed(""),
            request_model: Text::Borrowed(""),
            response_model: Text::Borrowed(""),
            operation_name: Text::Borrowed(""),
            provider_name: Text::Borrowed(""),
            outcome: Text::Borrowed(outcome::UNKNOWN),
            side: Side::Server,
            operation_source: Text::Borrowed("default"),
            error_type: Text::Borrowed(""),
            server_address: Text::Borrowed(""),
            server_port: Text::Borrowed(""),
            start_unix_ns: 0,
            ttft_s: None,
            tpot_s: None,
            e2e_s: None,
            queue_s: None,
            prefill_s: None,
            decode_s: None,
            inference_s: None,
            prompt_tokens: None,
            completion_tokens: None,
            gateway_overhead_s: None,
            client_overhead_s: None,
            edge_ttft_s: None,
            edge_span_id: None,
            joined_span_id: None,
            segments: Vec::new(),
            dimensions: Vec::new(),
            weight: 1.0,
            rejected: Vec::new(),
            segments_missing: Vec::new(),
            not_measurable: Vec::new(),
            segments_derived: Vec::new(),
            cached_tokens: None,
            cache_write_tokens: None,
            reasoning_tokens: None,
            itl_s: Vec::new(),
            tenant: Text::Borrowed(""),
            spec_accepted_tokens: None,
            spec_draft_tokens: None,
            spec_steps: None,
            lora_adapter: Text::Borrowed(""),
            lora_base_model: Text::Borrowed(""),
            extra: Vec::new(),
        }
    }

    /// `RequestRecord.succeeded`.
    pub fn succeeded(&self) -> bool {
        !outcome::failed(&self.outcome)
    }

    /// The record with every text owned: it outlives the trace it was read from.
    pub fn into_owned(self) -> Record<'static> {
        fn own(text: Text<'_>) -> Text<'static> {
            Text::Owned(text.into_owned())
        }
        fn own_all(texts: Vec<Text<'_>>) -> Vec<Text<'static>> {
            texts.into_iter().map(own).collect()
        }
        Record {
            trace_id: self.trace_id,
            span_id: self.span_id,
            engine_kind: own(self.engine_kind),
            adapter: own(self.adapter),
            service_name: own(self.service_name),
            model: own(self.model),
            model_source: own(self.model_source),
            request_model: own(self.request_model),
            response_model: own(self.response_model),
            operation_name: own(self.operation_name),
            provider_name: own(self.provider_name),
            outcome: own(self.outcome),
            side: self.side,
            operation_source: own(self.operation_source),
            error_type: own(self.error_type),
            server_address: own(self.server_address),
            server_port: own(self.server_port),
            start_unix_ns: self.start_unix_ns,
            ttft_s: self.ttft_s,
            tpot_s: self.tpot_s,
            e2e_s: self.e2e_s,
            queue_s: self.queue_s,
            prefill_s: self.prefill_s,
            decode_s: self.decode_s,
            inference_s: self.inference_s,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            gateway_overhead_s: self.gateway_overhead_s,
            client_overhead_s: self.client_overhead_s,
            edge_ttft_s: self.edge_ttft_s,
            edge_span_id: self.edge_span_id,
            joined_span_id: self.joined_span_id,
            segments: self.segments.into_iter().map(|s| Segment { name: own(s.name), ..s }).collect(),
            dimensions: own_all(self.dimensions),
            weight: self.weight,
            rejected: own_all(self.rejected),
            segments_missing: own_all(self.segments_missing),
            not_measurable: own_all(self.not_measurable),
            segments_derived: own_all(self.segments_derived),
            cached_tokens: self.cached_tokens,
            cache_write_tokens: self.cache_write_tokens,
            reasoning_tokens: self.reasoning_tokens,
            itl_s: self.itl_s,
            tenant: own(self.tenant),
            spec_accepted_tokens: self.spec_accepted_tokens,
            spec_draft_tokens: self.spec_draft_tokens,
            spec_steps: self.spec_steps,
            lora_adapter: own(self.lora_adapter),
            lora_base_model: own(self.lora_base_model),
            extra: self.extra,
        }
    }

    /// A field's value (`None` where it is `None` in Python). Texts and lists as they are held;
    /// ids as their bytes are not values (they are read as `trace_id`/`span_id` directly).
    pub fn get(&self, field: RecordField) -> Option<FieldValue<'_>> {
        use FieldValue as V;
        use RecordField as F;
        Some(match field {
            F::EngineKind => V::Text(&self.engine_kind),
            F::Adapter => V::Text(&self.adapter),
            F::ServiceName => V::Text(&self.service_name),
            F::Model => V::Text(&self.model),
            F::ModelSource => V::Text(&self.model_source),
            F::RequestModel => V::Text(&self.request_model),
            F::ResponseModel => V::Text(&self.response_model),
            F::OperationName => V::Text(&self.operation_name),
            F::ProviderName => V::Text(&self.provider_name),
            F::Outcome => V::Text(&self.outcome),
            F::Side => V::Text(self.side.as_str()),
            F::OperationSource => V::Text(&self.operation_source),
            F::ErrorType => V::Text(&self.error_type),
            F::ServerAddress => V::Text(&self.server_address),
            F::ServerPort => V::Text(&self.server_port),
            F::Tenant => V::Text(&self.tenant),
            F::LoraAdapter => V::Text(&self.lora_adapter),
            F::LoraBaseModel => V::Text(&self.lora_base_model),
            F::StartUnixNs => V::Int(self.start_unix_ns),
            F::TtftS => V::Float(self.ttft_s?),
            F::TpotS => V::Float(self.tpot_s?),
            F::E2eS => V::Float(self.e2e_s?),
            F::QueueS => V::Float(self.queue_s?),
            F::PrefillS => V::Float(self.prefill_s?),
            F::DecodeS => V::Float(self.decode_s?),
            F::InferenceS => V::Float(self.inference_s?),
            F::GatewayOverheadS => V::Float(self.gateway_overhead_s?),
            F::ClientOverheadS => V::Float(self.client_overhead_s?),
            F::EdgeTtftS => V::Float(self.edge_ttft_s?),
            F::Weight => V::Float(self.weight),
            F::PromptTokens => V::Int(self.prompt_tokens?),
            F::CompletionTokens => V::Int(self.completion_tokens?),
            F::CachedTokens => V::Int(self.cached_tokens?),
            F::CacheWriteTokens => V::Int(self.cache_write_tokens?),
            F::ReasoningTokens => V::Int(self.reasoning_tokens?),
            F::SpecAcceptedTokens => V::Int(self.spec_accepted_tokens?),
            F::SpecDraftTokens => V::Int(self.spec_draft_tokens?),
            F::SpecSteps => V::Int(self.spec_steps?),
            F::ItlS => V::Floats(&self.itl_s),
            F::Extra(id) => {
                let (_, value) = self.extra.iter().find(|(f, _)| *f == id)?;
                match value.as_ref() {
                    ValueRef::Float(v) => V::Float(v),
                    ValueRef::Int(v) => V::Int(v),
                    ValueRef::Text(v) => V::Text(v),
                    ValueRef::Flag(v) => V::Int(i64::from(v)),
                    ValueRef::Floats(crate::model::Floats::Slice(v)) => V::Floats(v),
                    ValueRef::Floats(_) | ValueRef::Texts(_) => return None,
                }
            }
            F::TraceId | F::SpanId | F::EdgeSpanId | F::JoinedSpanId | F::Segments | F::Dimensions | F::Rejected
            | F::SegmentsMissing | F::NotMeasurable | F::SegmentsDerived => return None,
        })
    }
}

/// A field's value as a metric or a policy reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FieldValue<'r> {
    Float(f64),
    Int(i64),
    Text(&'r str),
    Floats(&'r [f64]),
}

impl FieldValue<'_> {
    /// The value as a number (an int as float), as an observation reads it.
    pub fn number(self) -> Option<f64> {
        match self {
            FieldValue::Float(v) => Some(v),
            FieldValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }
}

/// `RequestRecord`'s fields, by name; `Extra` for one declared in Python only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordField {
    TraceId,
    SpanId,
    EngineKind,
    Adapter,
    ServiceName,
    Model,
    ModelSource,
    RequestModel,
    ResponseModel,
    OperationName,
    ProviderName,
    Outcome,
    Side,
    OperationSource,
    ErrorType,
    ServerAddress,
    ServerPort,
    StartUnixNs,
    TtftS,
    TpotS,
    E2eS,
    QueueS,
    PrefillS,
    DecodeS,
    InferenceS,
    PromptTokens,
    CompletionTokens,
    GatewayOverheadS,
    ClientOverheadS,
    EdgeTtftS,
    EdgeSpanId,
    JoinedSpanId,
    Segments,
    Dimensions,
    Weight,
    Rejected,
    SegmentsMissing,
    NotMeasurable,
    SegmentsDerived,
    CachedTokens,
    CacheWriteTokens,
    ReasoningTokens,
    ItlS,
    Tenant,
    SpecAcceptedTokens,
    SpecDraftTokens,
    SpecSteps,
    LoraAdapter,
    LoraBaseModel,
    Extra(FieldId),
}

/// Every field the engine knows by name, with its name in `RequestRecord`.
pub const RECORD_FIELDS: [(&str, RecordField); 49] = [
    ("trace_id", RecordField::TraceId),
    ("span_id", RecordField::SpanId),
    ("engine_kind", RecordField::EngineKind),
    ("adapter", RecordField::Adapter),
    ("service_name", RecordField::ServiceName),
    ("model", RecordField::Model),
    ("model_source", RecordField::ModelSource),
    ("request_model", RecordField::RequestModel),
    ("response_model", RecordField::ResponseModel),
    ("operation_name", RecordField::OperationName),
    ("provider_name", RecordField::ProviderName),
    ("outcome", RecordField::Outcome),
    ("side", RecordField::Side),
    ("operation_source", RecordField::OperationSource),
    ("error_type", RecordField::ErrorType),
    ("server_address", RecordField::ServerAddress),
    ("server_port", RecordField::ServerPort),
    ("start_unix_ns", RecordField::StartUnixNs),
    ("ttft_s", RecordField::TtftS),
    ("tpot_s", RecordField::TpotS),
    ("e2e_s", RecordField::E2eS),
    ("queue_s", RecordField::QueueS),
    ("prefill_s", RecordField::PrefillS),
    ("decode_s", RecordField::DecodeS),
    ("inference_s", RecordField::InferenceS),
    ("prompt_tokens", RecordField::PromptTokens),
    ("completion_tokens", RecordField::CompletionTokens),
    ("gateway_overhead_s", RecordField::GatewayOverheadS),
    ("client_overhead_s", RecordField::ClientOverheadS),
    ("edge_ttft_s", RecordField::EdgeTtftS),
    ("edge_span_id", RecordField::EdgeSpanId),
    ("joined_span_id", RecordField::JoinedSpanId),
    ("segments", RecordField::Segments),
    ("dimensions", RecordField::Dimensions),
    ("weight", RecordField::Weight),
    ("rejected", RecordField::Rejected),
    ("segments_missing", RecordField::SegmentsMissing),
    ("not_measurable", RecordField::NotMeasurable),
    ("segments_derived", RecordField::SegmentsDerived),
    ("cached_tokens", RecordField::CachedTokens),
    ("cache_write_tokens", RecordField::CacheWriteTokens),
    ("reasoning_tokens", RecordField::ReasoningTokens),
    ("itl_s", RecordField::ItlS),
    ("tenant", RecordField::Tenant),
    ("spec_accepted_tokens", RecordField::SpecAcceptedTokens),
    ("spec_draft_tokens", RecordField::SpecDraftTokens),
    ("spec_steps", RecordField::SpecSteps),
    ("lora_adapter", RecordField::LoraAdapter),
    ("lora_base_model", RecordField::LoraBaseModel),
];

/// The field named `name`, if the engine knows it by that name.
pub fn known_field(name: &str) -> Option<RecordField> {
    RECORD_FIELDS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_named_once_and_read_by_name() {
        let mut names: Vec<&str> = RECORD_FIELDS.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RECORD_FIELDS.len());
        let mut record = Record::new([1; 16], [2; 8]);
        record.ttft_s = Some(0.5);
        record.model = Text::Borrowed("m");
        assert_eq!(record.get(known_field("ttft_s").unwrap()), Some(FieldValue::Float(0.5)));
        assert_eq!(record.get(known_field("model").unwrap()), Some(FieldValue::Text("m")));
        assert_eq!(record.get(known_field("e2e_s").unwrap()), None);
        record.extra.push((FieldId(3), Value::Int(4)));
        assert_eq!(record.get(RecordField::Extra(FieldId(3))), Some(FieldValue::Int(4)));
        assert!(record.succeeded());
        record.outcome = Text::Borrowed(outcome::ABORT);
        assert!(!record.succeeded());
    }
}
