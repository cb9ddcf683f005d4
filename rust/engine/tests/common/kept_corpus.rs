//! The kept-trace corpus (`tests/data/kept/*.json.gz`, written by `generate.py` there from the
//! Python reference) read into the engine's values: each trace as the buffer holds it, its records,
//! the redactions by name. Shared by `kept_differential.rs` and `benches/kept.rs`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;

use flate2::read::GzDecoder;
use otel_llm_engine::kept::Redaction;
use otel_llm_engine::model::{NewSpan, TraceData};
use otel_llm_engine::record::{Record, Segment, Side};
use serde_json::Value as Json;

use crate::common;

/// A corpus file: its redactions by name, its traces (with their records) and its cases.
pub struct Corpus {
    pub redactions: HashMap<String, Redaction>,
    pub traces: Vec<(TraceData, Vec<Record<'static>>)>,
    pub cases: Vec<Json>,
}

impl Corpus {
    pub fn load(name: &str) -> Corpus {
        let json = load(name);
        let redactions = json["redactions"].as_object().unwrap().iter()
            .map(|(name, settings)| (name.clone(), redaction(settings))).collect();
        let origins: Vec<(Vec<u8>, Vec<u8>)> = json["origins"].as_array().unwrap().iter()
            .map(|o| (unhex(common::text(&o[0])), unhex(common::text(&o[1])))).collect();
        let traces = json["traces"].as_array().unwrap().iter().map(|t| {
            let data = trace_data(t, &origins);
            let records = t["records"].as_array().unwrap().iter().map(|r| record(data.trace_id, r)).collect();
            (data, records)
        }).collect();
        Corpus { redactions, traces, cases: json["cases"].as_array().unwrap().clone() }
    }
}

fn load(name: &str) -> Json {
    let path = format!("{}/tests/data/kept/{name}.json.gz", env!("CARGO_MANIFEST_DIR"));
    let mut text = String::new();
    GzDecoder::new(std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
        .read_to_string(&mut text).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Bytes the generator wrote in hex (`bytes.hex()`), of any length.
fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

pub fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn strings(json: &Json) -> Vec<String> {
    json.as_array().unwrap().iter().map(|v| common::text(v).to_owned()).collect()
}

fn redaction(json: &Json) -> Redaction {
    Redaction {
        key_prefixes: strings(&json["key_prefixes"]),
        key_patterns: strings(&json["key_patterns"]),
        event_names: strings(&json["event_names"]),
        max_free_text_bytes: json["max_free_text_bytes"].as_u64().unwrap() as usize,
        allowed_keys: strings(&json["allowed_keys"]),
        allowed_patterns: strings(&json["allowed_patterns"]),
        metadata_keys: (!json["metadata_keys"].is_null()).then(|| strings(&json["metadata_keys"])),
        url_keys: strings(&json["url_keys"]),
        status_message_key: common::text(&json["status_message_key"]).to_owned(),
        error_type_key: common::text(&json["error_type_key"]).to_owned(),
    }
}

fn owned(json: &Json) -> Cow<'static, str> {
    Cow::Owned(common::text(json).to_owned())
}

fn record(trace_id: [u8; 16], json: &Json) -> Record<'static> {
    let mut record = Record::new(trace_id, common::hex_bytes(common::text(&json["span_id"])));
    record.side = Side::parse(common::text(&json["side"])).unwrap();
    record.outcome = owned(&json["outcome"]);
    record.model_source = owned(&json["model_source"]);
    record.provider_name = owned(&json["provider_name"]);
    record.operation_source = owned(&json["operation_source"]);
    record.operation_name = owned(&json["operation_name"]);
    record.request_model = owned(&json["request_model"]);
    record.prompt_tokens = json["prompt_tokens"].as_i64();
    record.completion_tokens = json["completion_tokens"].as_i64();
    record.tpot_s = common::float(&json["tpot_s"]);
    record.gateway_overhead_s = common::float(&json["gateway_overhead_s"]);
    record.client_overhead_s = common::float(&json["client_overhead_s"]);
    let texts = |json: &Json| strings(json).into_iter().map(Cow::Owned).collect::<Vec<_>>();
    record.segments_missing = texts(&json["segments_missing"]);
    record.segments_derived = texts(&json["segments_derived"]);
    record.not_measurable = texts(&json["not_measurable"]);
    record.segments = json["segments"].as_array().unwrap().iter().map(|s| Segment {
        name: owned(&s[0]),
        start_unix_ns: s[1].as_i64().unwrap(),
        end_unix_ns: s[2].as_i64().unwrap(),
    }).collect();
    record.joined_span_id = json["joined_span_id"].as_str().map(common::hex_bytes);
    record
}

/// A trace as the engine's buffer holds it: each span put in arrival order, with its origin.
fn trace_data(json: &Json, origins: &[(Vec<u8>, Vec<u8>)]) -> TraceData {
    let trace_id: [u8; 16] = common::hex_bytes(common::text(&json["trace_id"]));
    let mut data = TraceData::new(trace_id);
    let spans = json["spans"].as_array().unwrap();
    for span in spans {
        let payload = unhex(common::text(&span["payload"]));
        let (resource, scope) = &origins[span["origin"].as_u64().unwrap() as usize];
        data.put(&NewSpan {
            span_id: common::hex_bytes(common::text(&span["span_id"])),
            parent_span_id: span["parent"].as_str().map(common::hex_bytes),
            kind: span["kind"].as_i64().unwrap() as i32,
            status_code: 0,
            start_unix_ns: span["start"].as_u64().unwrap(),
            end_unix_ns: span["end"].as_u64().unwrap(),
            payload: &payload,
            trace_state: common::text(&span["trace_state"]),
            resource,
            scope,
            service_name: "",
            observation: None,
            attrs_kept: true,
        });
    }
    assert_eq!(data.len(), spans.len(), "span ids repeat in {}", json["trace_id"]);
    data
}

