//! The differential corpus's JSON (`tests/data/series/generate.py`) as the engine's types: the
//! declarations as a `MetricsSpec` (what the binding builds from Python's) and the records.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use otel_llm_engine::record::{known_field, Record, RecordField, Segment, Side};
use otel_llm_engine::series::{
    CounterSpec, ExponentialLimits, HistogramSpec, LabelSource, MetricsSpec, NamingSpec, Number, SegmentsSpec, ValueSpec,
};
use serde_json::Value;

pub fn data(scenario: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/series").join(scenario)
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A float as the generator wrote it (Python's repr).
pub fn float(value: &Value) -> f64 {
    let text = value.as_str().unwrap_or_else(|| panic!("a float as its repr, got {value}"));
    text.parse().unwrap_or_else(|_| panic!("not a float: {text}"))
}

pub fn floats(value: &Value) -> Vec<f64> {
    value.as_array().expect("a list of floats").iter().map(float).collect()
}

pub fn text(value: &Value) -> String {
    value.as_str().unwrap_or_else(|| panic!("a string, got {value}")).to_string()
}

fn field(value: &Value) -> RecordField {
    let name = value.as_str().expect("a field name");
    known_field(name).unwrap_or_else(|| panic!("RequestRecord has no field {name}"))
}

fn fixed_label(value: &Value) -> Option<(String, String)> {
    value.as_array().map(|pair| (text(&pair[0]), text(&pair[1])))
}

fn value_spec(value: &Value) -> ValueSpec {
    let (kind, args) = value.as_object().and_then(|o| o.iter().next()).expect("a value declaration");
    match kind.as_str() {
        "field" => ValueSpec::Field(field(args)),
        "constant" => ValueSpec::Constant(match args {
            Value::Null => None,
            number => Some(match number.get("int") {
                Some(int) => Number::Int(int.as_i64().expect("an int")),
                None => Number::Float(float(&number["float"])),
            }),
        }),
        "difference" => ValueSpec::Difference(field(&args[0]), field(&args[1])),
        "ratio" => ValueSpec::Ratio {
            numerator: field(&args[0]),
            denominator: field(&args[1]),
            offset: (!args[2].is_null()).then(|| float(&args[2])),
        },
        "unless_at_most" => ValueSpec::UnlessAtMost { field: field(&args[0]), guard: field(&args[1]), limit: args[2].as_i64().unwrap() },
        "if_set" => ValueSpec::IfSet { field: field(&args[0]), then: Box::new(value_spec(&args[1])) },
        other => panic!("unknown value kind {other}"),
    }
}

/// What the binding does: the Python declarations, as data, into a `MetricsSpec`.
pub fn metrics_spec(spec: &Value) -> MetricsSpec {
    let namings = spec["namings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|naming| NamingSpec {
            key: text(&naming["key"]),
            side: Side::parse(naming["side"].as_str().unwrap()).unwrap(),
            label_names: naming["label_names"].as_array().unwrap().iter().map(text).collect(),
            labels: naming["labels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|label| match label {
                    Value::Array(pair) => LabelSource::Either(field(&pair[0]), field(&pair[1])),
                    name => LabelSource::Field(field(name)),
                })
                .collect(),
            histograms: naming["histograms"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| HistogramSpec {
                    name: text(&h["name"]),
                    unit: text(&h["unit"]),
                    description: text(&h["description"]),
                    buckets: floats(&h["buckets"]),
                    value: value_spec(&h["value"]),
                    success_only: h["success_only"].as_bool().unwrap(),
                    fixed_label: fixed_label(&h["fixed_label"]),
                    per_step: (!h["per_step"].is_null()).then(|| field(&h["per_step"])),
                    buckets_by_model: h["buckets_by_model"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|pair| (text(&pair[0]), floats(&pair[1])))
                        .collect(),
                })
                .collect(),
            counters: naming["counters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| CounterSpec {
                    name: text(&c["name"]),
                    unit: text(&c["unit"]),
                    description: text(&c["description"]),
                    value: value_spec(&c["value"]),
                    by_outcome: c["by_outcome"].as_bool().unwrap(),
                    fixed_label: fixed_label(&c["fixed_label"]),
                })
                .collect(),
            schema_url: text(&naming["schema_url"]),
        })
        .collect();
    let segments = &spec["segments"];
    MetricsSpec {
        namings,
        segments: SegmentsSpec {
            name: text(&segments["name"]),
            unit: text(&segments["unit"]),
            description: text(&segments["description"]),
            buckets: floats(&segments["buckets"]),
        },
        dimension_names: spec["dimension_names"].as_array().unwrap().iter().map(text).collect(),
        series_limit: spec["series_limit"].as_u64().unwrap() as usize,
        series_limit_bytes: spec["series_limit_bytes"].as_u64().unwrap(),
        max_label_value_bytes: spec["max_label_value_bytes"].as_u64().unwrap() as usize,
        exponential: spec["exponential"].as_array().map(|pair| ExponentialLimits {
            max_size: pair[0].as_u64().unwrap() as usize,
            max_scale: pair[1].as_i64().unwrap() as i32,
        }),
    }
}

pub fn hex<const N: usize>(value: &Value) -> [u8; N] {
    let text = value.as_str().unwrap();
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

fn optional_hex(value: &Value) -> Option<[u8; 8]> {
    (!value.as_str().unwrap().is_empty()).then(|| hex::<8>(value))
}

fn owned(value: &Value) -> Cow<'static, str> {
    Cow::Owned(text(value))
}

fn owned_all(value: &Value) -> Vec<Cow<'static, str>> {
    value.as_array().unwrap().iter().map(owned).collect()
}

/// A record of `records.json`: every `RequestRecord` field by name.
pub fn record(json: &Value) -> Record<'static> {
    let mut record = Record::new(hex::<16>(&json["trace_id"]), hex::<8>(&json["span_id"]));
    let optional_float = |name: &str| (!json[name].is_null()).then(|| float(&json[name]));
    let optional_int = |name: &str| json[name].as_i64();
    for (name, field) in otel_llm_engine::record::RECORD_FIELDS {
        let value = &json[name];
        assert!(json.get(name).is_some(), "records.json lacks {name}");
        use RecordField as F;
        match field {
            F::TraceId | F::SpanId => {}
            F::EngineKind => record.engine_kind = owned(value),
            F::Adapter => record.adapter = owned(value),
            F::ServiceName => record.service_name = owned(value),
            F::Model => record.model = owned(value),
            F::ModelSource => record.model_source = owned(value),
            F::RequestModel => record.request_model = owned(value),
            F::ResponseModel => record.response_model = owned(value),
            F::OperationName => record.operation_name = owned(value),
            F::ProviderName => record.provider_name = owned(value),
            F::Outcome => record.outcome = owned(value),
            F::Side => record.side = Side::parse(value.as_str().unwrap()).unwrap(),
            F::OperationSource => record.operation_source = owned(value),
            F::ErrorType => record.error_type = owned(value),
            F::ServerAddress => record.server_address = owned(value),
            F::ServerPort => record.server_port = owned(value),
            F::StartUnixNs => record.start_unix_ns = value.as_i64().unwrap(),
            F::TtftS => record.ttft_s = optional_float(name),
            F::TpotS => record.tpot_s = optional_float(name),
            F::E2eS => record.e2e_s = optional_float(name),
            F::QueueS => record.queue_s = optional_float(name),
            F::PrefillS => record.prefill_s = optional_float(name),
            F::DecodeS => record.decode_s = optional_float(name),
            F::InferenceS => record.inference_s = optional_float(name),
            F::PromptTokens => record.prompt_tokens = optional_int(name),
            F::CompletionTokens => record.completion_tokens = optional_int(name),
            F::GatewayOverheadS => record.gateway_overhead_s = optional_float(name),
            F::ClientOverheadS => record.client_overhead_s = optional_float(name),
            F::EdgeTtftS => record.edge_ttft_s = optional_float(name),
            F::EdgeSpanId => record.edge_span_id = optional_hex(value),
            F::JoinedSpanId => record.joined_span_id = optional_hex(value),
            F::Segments => {
                record.segments = value
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| Segment { name: owned(&s[0]), start_unix_ns: s[1].as_i64().unwrap(), end_unix_ns: s[2].as_i64().unwrap() })
                    .collect()
            }
            F::Dimensions => record.dimensions = owned_all(value),
            F::Weight => record.weight = float(value),
            F::Rejected => record.rejected = owned_all(value),
            F::SegmentsMissing => record.segments_missing = owned_all(value),
            F::NotMeasurable => record.not_measurable = owned_all(value),
            F::SegmentsDerived => record.segments_derived = owned_all(value),
            F::CachedTokens => record.cached_tokens = optional_int(name),
            F::CacheWriteTokens => record.cache_write_tokens = optional_int(name),
            F::ReasoningTokens => record.reasoning_tokens = optional_int(name),
            F::ItlS => record.itl_s = floats(value),
            F::Tenant => record.tenant = owned(value),
            F::SpecAcceptedTokens => record.spec_accepted_tokens = optional_int(name),
            F::SpecDraftTokens => record.spec_draft_tokens = optional_int(name),
            F::SpecSteps => record.spec_steps = optional_int(name),
            F::LoraAdapter => record.lora_adapter = owned(value),
            F::LoraBaseModel => record.lora_base_model = owned(value),
            F::Extra(_) => unreachable!("RECORD_FIELDS names no extra field"),
        }
    }
    record
}
