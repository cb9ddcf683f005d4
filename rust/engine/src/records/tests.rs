//! The rules of `requests.py`, `segments.py` and `composite.sglang` on hand-made traces, each
//! expected value worked out from the Python rule it tests (the differential corpus,
//! `tests/records_differential.rs`, compares with the Python reference's own records).

use std::collections::{HashMap, HashSet};

use super::*;
use crate::model::{NewSpan, Observation, Value, SPAN_KIND_CLIENT, SPAN_KIND_INTERNAL, STATUS_CODE_ERROR};
use crate::record::{outcome, Segment};
use crate::wire::push_varint;

const SERVER: i32 = SPAN_KIND_SERVER;
const CLIENT: i32 = SPAN_KIND_CLIENT;
const INTERNAL: i32 = SPAN_KIND_INTERNAL;
const BASE: u64 = 1_767_225_600_000_000_000;
const MS: u64 = 1_000_000;
const TRACE: [u8; 16] = [1; 16];

/// The native observation schema (`OBSERVATION_FIELDS` as the crate declares it), and one field
/// Python declares beyond it.
fn schema() -> Schema {
    let mut fields: Vec<(String, Kind)> = Vec::new();
    for name in ["ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s", "preprocess_s", "tpot_s",
                 "dispatch_to_first_token_s", "x_custom_s"] {
        fields.push((name.into(), Kind::Float));
    }
    for name in ["prompt_tokens", "completion_tokens", "max_tokens", "cached_tokens", "cache_write_tokens",
                 "reasoning_tokens", "spec_accepted_tokens", "spec_draft_tokens", "spec_steps"] {
        fields.push((name.into(), Kind::Int));
    }
    for name in ["request_model", "response_model", "finish_reason", "operation_name", "provider_name",
                 "server_address", "server_port", "error_type", "spec_decode_rejected"] {
        fields.push((name.into(), Kind::Text));
    }
    fields.push(("is_error".into(), Kind::Flag));
    fields.push(("itl_s".into(), Kind::Floats));
    fields.push(("derived".into(), Kind::Texts));
    Schema::new(fields).unwrap()
}

const VLLM: u16 = 0;
const SGLANG_ROOT: u16 = 1;
const STAGE: u16 = 2;
const GENAI_SHAPE: u16 = 3;
const TGI: u16 = 4;
const TRITON: u16 = 5;
const TRTLLM_SHAPE: u16 = 6;
const TRITON_MODEL: u16 = 7;

fn shapes() -> Vec<ShapeInfo> {
    let shape = |adapter: &str, kind: &str, part: &str, gateway: bool, python: bool| ShapeInfo {
        adapter: adapter.into(), engine_kind: kind.into(), part: part.into(), may_be_gateway: gateway,
        python_records: python,
    };
    vec![
        shape("vllm_v1", "vllm", "", false, false),
        shape("sglang", "sglang", "", false, false),
        shape("sglang_stage", "sglang", "sglang_stage", false, false),
        shape("genai", "genai", "", true, false),
        shape("tgi", "tgi", "", false, false),
        shape("triton_root", "triton", "", false, true),
        shape("trtllm", "trtllm", "", false, false),
        shape("triton_model", "triton", "triton_model", false, true),
    ]
}

/// An attribute value as OTLP's `AnyValue` bytes.
#[derive(Clone, Debug)]
enum V {
    S(&'static str),
    I(i64),
    D(f64),
    B(bool),
    Bytes(&'static [u8]),
    Array(Vec<V>),
}

fn any_bytes(value: &V) -> Vec<u8> {
    let mut out = Vec::new();
    let delimited = |out: &mut Vec<u8>, tag: u8, data: &[u8]| {
        out.push(tag);
        push_varint(out, data.len() as u64);
        out.extend_from_slice(data);
    };
    match value {
        V::S(s) => delimited(&mut out, 0x0a, s.as_bytes()),
        V::B(b) => out.extend_from_slice(&[0x10, u8::from(*b)]),
        V::I(i) => {
            out.push(0x18);
            push_varint(&mut out, *i as u64);
        }
        V::D(d) => {
            out.push(0x21);
            out.extend_from_slice(&d.to_le_bytes());
        }
        V::Array(values) => {
            let mut array = Vec::new();
            for v in values {
                delimited(&mut array, 0x0a, &any_bytes(v));
            }
            delimited(&mut out, 0x2a, &array);
        }
        V::Bytes(b) => delimited(&mut out, 0x3a, b),
    }
    out
}

fn key_value(key: &str, value: &V) -> Vec<u8> {
    let mut entry = vec![0x0a];
    push_varint(&mut entry, key.len() as u64);
    entry.extend_from_slice(key.as_bytes());
    let any = any_bytes(value);
    entry.push(0x12);
    push_varint(&mut entry, any.len() as u64);
    entry.extend_from_slice(&any);
    entry
}

fn push_message(out: &mut Vec<u8>, tag: u8, data: &[u8]) {
    out.push(tag);
    push_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// A span to put in a test trace.
#[derive(Clone, Debug)]
struct S {
    id: u8,
    parent: Option<u8>,
    kind: i32,
    name: &'static str,
    start: u64,
    end: u64,
    status: i32,
    trace_state: &'static str,
    attrs: Vec<(&'static str, V)>,
    events: Vec<(&'static str, u64)>,
    service: &'static str,
    resource: Vec<(&'static str, V)>,
    obs: Option<(u16, Vec<(&'static str, Value)>)>,
    /// `SpanSlot::attrs_kept`, as ingest sets it.
    attrs_kept: bool,
}

fn span(id: u8) -> S {
    S { id, parent: None, kind: SERVER, name: "span", start: BASE, end: BASE + 1000 * MS, status: 0, trace_state: "",
        attrs: Vec::new(), events: Vec::new(), service: "svc", resource: vec![("service.name", V::S("svc"))], obs: None,
        attrs_kept: true }
}

impl S {
    fn parent(mut self, parent: u8) -> S {
        self.parent = Some(parent);
        self
    }
    fn kind(mut self, kind: i32) -> S {
        self.kind = kind;
        self
    }
    fn name(mut self, name: &'static str) -> S {
        self.name = name;
        self
    }
    /// Start and end, in ms from `BASE` (negative: before it).
    fn at(mut self, start_ms: i64, end_ms: i64) -> S {
        self.start = (BASE as i64 + start_ms * MS as i64) as u64;
        self.end = (BASE as i64 + end_ms * MS as i64) as u64;
        self
    }
    fn times(mut self, start: u64, end: u64) -> S {
        self.start = start;
        self.end = end;
        self
    }
    fn failed(mut self) -> S {
        self.status = STATUS_CODE_ERROR;
        self
    }
    fn state(mut self, trace_state: &'static str) -> S {
        self.trace_state = trace_state;
        self
    }
    fn attr(mut self, key: &'static str, value: V) -> S {
        self.attrs.push((key, value));
        self
    }
    fn event(mut self, name: &'static str, time: u64) -> S {
        self.events.push((name, time));
        self
    }
    fn resource(mut self, key: &'static str, value: V) -> S {
        self.resource.push((key, value));
        self
    }
    fn service(mut self, service: &'static str) -> S {
        self.service = service;
        self.resource = vec![("service.name", V::S(service))];
        self
    }
    fn obs(mut self, shape: u16, values: Vec<(&'static str, Value)>) -> S {
        self.obs = Some((shape, values));
        self.attrs_kept = shape != STAGE; // the table's stage shape reads no attribute: ingest keeps none
        self
    }
    /// A span ingest keeps no attributes of for assembly: no candidate of `classify`'s, or refused.
    fn unkept(mut self) -> S {
        self.attrs_kept = false;
        self
    }

    /// The span's OTLP bytes, as an exporter writes them.
    fn payload(&self) -> Vec<u8> {
        let mut out = vec![0x0a, 16];
        out.extend_from_slice(&TRACE);
        out.extend_from_slice(&[0x12, 8]);
        out.extend_from_slice(&[self.id; 8]);
        if !self.trace_state.is_empty() {
            push_message(&mut out, 0x1a, self.trace_state.as_bytes());
        }
        if let Some(parent) = self.parent {
            out.extend_from_slice(&[0x22, 8]);
            out.extend_from_slice(&[parent; 8]);
        }
        push_message(&mut out, 0x2a, self.name.as_bytes());
        out.push(0x30);
        push_varint(&mut out, self.kind as u64);
        out.push(0x39);
        out.extend_from_slice(&self.start.to_le_bytes());
        out.push(0x41);
        out.extend_from_slice(&self.end.to_le_bytes());
        for (key, value) in &self.attrs {
            push_message(&mut out, 0x4a, &key_value(key, value));
        }
        for (name, time) in &self.events {
            let mut event = vec![0x09];
            event.extend_from_slice(&time.to_le_bytes());
            push_message(&mut event, 0x12, name.as_bytes());
            push_message(&mut out, 0x5a, &event);
        }
        if self.status != 0 {
            push_message(&mut out, 0x7a, &[0x18, self.status as u8]);
        }
        out
    }
}

fn observation(schema: &Schema, shape: u16, values: &[(&'static str, Value)]) -> Observation {
    let mut observation = Observation::new(shape);
    for (name, value) in values {
        observation.set(schema.id(name).unwrap_or_else(|| panic!("no field {name}")), value.clone());
    }
    observation
}

fn trace(spans: &[S]) -> TraceData {
    let schema = schema();
    let mut data = TraceData::new(TRACE);
    for s in spans {
        let payload = s.payload();
        let mut resource = Vec::new();
        for (key, value) in &s.resource {
            push_message(&mut resource, 0x0a, &key_value(key, value));
        }
        let observation = s.obs.as_ref().map(|(shape, values)| observation(&schema, *shape, values));
        data.put(&NewSpan {
            span_id: [s.id; 8], parent_span_id: s.parent.map(|p| [p; 8]), kind: s.kind, status_code: s.status,
            start_unix_ns: s.start, end_unix_ns: s.end, payload: &payload, trace_state: s.trace_state,
            resource: &resource, scope: b"", service_name: s.service, observation: observation.as_ref(),
            attrs_kept: s.attrs_kept,
        });
    }
    data
}

fn builder(settings: RecordSettings) -> RecordBuilder {
    RecordBuilder::new(&schema(), settings, Vec::new()).unwrap()
}

fn f(value: f64) -> Value {
    Value::Float(value)
}
fn i(value: i64) -> Value {
    Value::Int(value)
}
fn t(value: &str) -> Value {
    Value::Text(value.into())
}

/// A vLLM span's observation: ttft 0.25, e2e 1.0, queue 0.0625, prefill 0.125, decode 0.5,
/// 10 prompt and 21 output tokens.
fn vllm_values() -> Vec<(&'static str, Value)> {
    vec![("ttft_s", f(0.25)), ("e2e_s", f(1.0)), ("queue_s", f(0.0625)), ("prefill_s", f(0.125)),
         ("decode_s", f(0.5)), ("prompt_tokens", i(10)), ("completion_tokens", i(21)), ("provider_name", t("vllm"))]
}

fn with(mut values: Vec<(&'static str, Value)>, more: &[(&'static str, Value)]) -> Vec<(&'static str, Value)> {
    for (name, value) in more {
        values.retain(|(n, _)| n != name);
        values.push((name, value.clone()));
    }
    values
}

fn engine(id: u8) -> S {
    span(id).name("llm_request").obs(VLLM, vllm_values())
}

fn genai(id: u8, kind: i32, values: &[(&'static str, Value)]) -> S {
    span(id).kind(kind).name("chat m").obs(GENAI_SHAPE, values.to_vec())
}

type Out = (Vec<Record<'static>>, Vec<(&'static str, String)>);

fn run(builder: &RecordBuilder, spans: &[S]) -> Out {
    let data = trace(spans);
    let shapes = shapes();
    match builder.build(&data, &shapes) {
        Built::Records(records, malformed) => (records.into_iter().map(Record::into_owned).collect(), malformed),
        Built::Declined(reason) => panic!("declined: {reason:?}"),
    }
}

fn one(spans: &[S]) -> Record<'static> {
    one_with(&builder(RecordSettings::default()), spans)
}

fn one_with(builder: &RecordBuilder, spans: &[S]) -> Record<'static> {
    let (records, malformed) = run(builder, spans);
    assert!(malformed.is_empty(), "{malformed:?}");
    assert_eq!(records.len(), 1, "{records:#?}");
    records.into_iter().next().unwrap()
}

fn declined(builder: &RecordBuilder, spans: &[S]) -> Decline {
    let data = trace(spans);
    let shapes = shapes();
    match builder.build(&data, &shapes) {
        Built::Declined(reason) => reason,
        Built::Records(records, _) => panic!("built {} records", records.len()),
    }
}

fn segment(name: &'static str, start: u64, end: u64) -> Segment<'static> {
    Segment { name: Cow::Borrowed(name), start_unix_ns: start as i64, end_unix_ns: end as i64 }
}

use std::borrow::Cow;

// --- the shapes of requests ------------------------------------------------------------------

#[test]
fn a_lone_engine_span_is_its_request() {
    let record = one(&[engine(2).obs(VLLM, with(vllm_values(), &[("response_model", t("m")),
                                                                  ("finish_reason", t("stop")),
                                                                  ("operation_name", t("chat"))]))]);
    assert_eq!((record.trace_id, record.span_id), (TRACE, [2; 8]));
    assert_eq!((&*record.engine_kind, &*record.adapter, &*record.service_name), ("vllm", "vllm_v1", "svc"));
    assert_eq!((&*record.model, &*record.model_source), ("m", "span:gen_ai.response.model"));
    assert_eq!((&*record.request_model, &*record.response_model), ("m", "m"));
    assert_eq!((&*record.operation_name, &*record.operation_source), ("chat", "span"));
    assert_eq!((&*record.outcome, record.side, &*record.provider_name), ("stop", Side::Server, "vllm"));
    assert_eq!(record.start_unix_ns, BASE as i64);
    assert_eq!((record.ttft_s, record.e2e_s, record.queue_s, record.prefill_s, record.decode_s),
               (Some(0.25), Some(1.0), Some(0.0625), Some(0.125), Some(0.5)));
    assert_eq!(record.inference_s, Some(0.625));
    assert_eq!(record.tpot_s, Some(0.025)); // 0.5 / (21 - 1)
    assert_eq!((record.prompt_tokens, record.completion_tokens), (Some(10), Some(21)));
    assert_eq!(record.segments, vec![
        segment("preprocess", BASE, BASE + 62_500_000), segment("queue", BASE + 62_500_000, BASE + 125 * MS),
        segment("prefill", BASE + 125 * MS, BASE + 250 * MS), segment("decode", BASE + 250 * MS, BASE + 750 * MS),
        segment("postprocess", BASE + 750 * MS, BASE + 1000 * MS)]);
    assert_eq!((record.weight, record.edge_span_id, record.joined_span_id), (1.0, None, None));
    assert!(record.rejected.is_empty() && record.not_measurable.is_empty() && record.segments_missing.is_empty());
}

#[test]
fn an_engine_under_its_gateway_takes_the_gateways_model_operation_outcome_and_times() {
    let gateway = genai(1, SERVER, &[("request_model", t("gw-model")), ("finish_reason", t("LENGTH"))])
        .at(-10, 1050).attr("http.route", V::S("/v1/chat/completions"))
        .attr("gen_ai.server.time_to_first_token", V::D(0.3));
    let record = one(&[gateway.clone(), engine(2).parent(1)]);
    assert_eq!((&*record.model, &*record.model_source), ("gw-model", "gateway:gen_ai.request.model"));
    assert_eq!((&*record.request_model, &*record.response_model), ("gw-model", ""));
    assert_eq!((&*record.operation_name, &*record.operation_source), ("chat", "route"));
    assert_eq!(&*record.outcome, outcome::LENGTH); // the engine says none; the gateway's, lowercased
    assert_eq!(record.edge_span_id, Some([1; 8]));
    assert_eq!(record.gateway_overhead_s, Some(1_060_000_000f64 / 1e9 - 1.0));
    assert_eq!(record.edge_ttft_s, Some(0.3));
    assert_eq!(record.joined_span_id, None);
    // The general joining reads this shape the same (`_simple_request`'s claim).
    let data = trace(&[gateway, engine(2).parent(1)]);
    let (b, shapes) = (builder(RecordSettings::default()), shapes());
    let view = TraceView::new(&b, &data, &shapes);
    assert!(view.simple_request().is_some());
    assert_eq!(view.records_of_any_trace().unwrap(), view.records_of_trace().unwrap());
}

#[test]
fn a_failed_gateway_fails_the_request_with_its_error_type() {
    let gateway = genai(1, SERVER, &[]).at(-10, 1050).failed();
    let record = one(&[gateway.clone().attr("error.type", V::S("Timeout")), engine(2).parent(1)]);
    assert_eq!((&*record.outcome, &*record.error_type), (outcome::ERROR, "Timeout"));
    let record = one(&[gateway.clone(), engine(2).parent(1)]);
    assert_eq!((&*record.outcome, &*record.error_type), (outcome::ERROR, "_OTHER"));
    let record = one(&[gateway.clone().attr("error.type", V::I(504)), engine(2).parent(1)]);
    assert_eq!(&*record.error_type, "504");
    // An engine that failed already keeps its own error type.
    let failing = engine(2).parent(1).obs(VLLM, with(vllm_values(), &[("is_error", Value::Flag(true)),
                                                                      ("error_type", t("oom"))]));
    let record = one(&[gateway.clone().attr("error.type", V::S("Timeout")), failing]);
    assert_eq!((&*record.outcome, &*record.error_type), (outcome::ERROR, "oom"));
    // An error type Python renders with `repr` is left to Python.
    let b = builder(RecordSettings::default());
    assert_eq!(declined(&b, &[gateway.attr("error.type", V::D(1.5)), engine(2).parent(1)]), Decline::ReprText);
}

#[test]
fn a_sibling_that_contains_the_engine_is_its_gateway_within_the_clock_skew() {
    // LiteLLM forwards its caller's traceparent: its proxy span and the engine's are siblings.
    let upstream = 9;
    let proxy = span(1).parent(upstream).name("POST /v1/chat/completions").at(-1, 1001);
    let call = genai(3, INTERNAL, &[("request_model", t("proxy-model"))]).name("litellm_request").parent(1).at(0, 1000);
    let (records, malformed) = run(&builder(RecordSettings::default()),
                                   &[proxy.clone(), call, engine(2).parent(upstream)]);
    assert!(malformed.is_empty());
    let [server, client] = <[Record; 2]>::try_from(records).unwrap();
    assert_eq!((server.span_id, server.edge_span_id), ([2; 8], Some([1; 8])));
    assert_eq!((&*server.model, &*server.model_source), ("proxy-model", "client:gen_ai.request.model"));
    assert_eq!(server.joined_span_id, Some([3; 8])); // the gateway's own call out
    assert_eq!(server.client_overhead_s, Some(0.0));
    assert_eq!(server.gateway_overhead_s, Some(1_002_000_000f64 / 1e9 - 1.0));
    assert_eq!((client.span_id, client.side, &*client.engine_kind), ([3; 8], Side::Client, "client"));
    assert_eq!(client.joined_span_id, Some([2; 8]));
    assert_eq!((&*client.model, &*client.model_source), ("proxy-model", "span:gen_ai.request.model"));
    // Within 5 ms of skew it still holds the engine's interval; past it, it is not its gateway.
    let skewed = |start_ms: i64| {
        let proxy = span(1).parent(upstream).at(start_ms, 1000);
        one(&[proxy, engine(2).parent(upstream)])
    };
    assert_eq!(skewed(4).edge_span_id, Some([1; 8]));
    assert_eq!(skewed(6).edge_span_id, None);
}

#[test]
fn the_tightest_siblings_are_joined_and_a_huge_fan_out_is_bounded() {
    // 3000 unclaimed SERVER siblings all holding the engine span: sorted by duration (a stable
    // sort: ties in the trace's order), the 64 tightest are candidates and the 4 tightest joined,
    // the last of them the edge. Sibling n starts (n % 97) + 1 ms early: the tightest are n = 0,
    // 97, 194 and 291.
    let upstream = 200;
    let mut data = trace(&[engine(2).parent(upstream)]);
    let id = |n: u32| [(n >> 8) as u8, n as u8, 0xee, 0, 0, 0, 0, 0];
    for n in 0..3000u32 {
        let sibling = span(3).parent(upstream).at(-(n as i64 % 97) - 1, 1001);
        let payload = sibling.payload();
        data.put(&NewSpan {
            span_id: id(n), parent_span_id: Some([upstream; 8]), kind: SERVER, status_code: 0,
            start_unix_ns: sibling.start, end_unix_ns: sibling.end, payload: &payload, trace_state: "", resource: b"",
            scope: b"", service_name: "svc", observation: None, attrs_kept: true,
        });
    }
    let shapes = shapes();
    let b = builder(RecordSettings::default());
    let Built::Records(records, _) = b.build(&data, &shapes) else { panic!("declined") };
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].edge_span_id, Some(id(291)));
    assert_eq!(records[0].gateway_overhead_s, Some(1_002_000_000f64 / 1e9 - 1.0));
}

#[test]
fn a_client_over_a_gateway_over_an_engine_gives_a_server_and_a_client_record() {
    let client = genai(1, CLIENT, &[("operation_name", t("chat")), ("ttft_s", f(0.3))]).at(-20, 1100);
    let gateway = genai(2, SERVER, &[]).parent(1).at(-10, 1050);
    let served = engine(3).parent(2).obs(VLLM, with(vllm_values(), &[("response_model", t("served-m"))]));
    let (records, _) = run(&builder(RecordSettings::default()), &[client, gateway, served]);
    let [server, client] = <[Record; 2]>::try_from(records).unwrap();
    assert_eq!((server.span_id, server.edge_span_id, server.joined_span_id), ([3; 8], Some([2; 8]), Some([1; 8])));
    assert_eq!(server.client_overhead_s, Some(1_120_000_000f64 / 1e9 - 1.0));
    assert_eq!((&*server.operation_name, &*server.operation_source), ("chat", "client"));
    assert_eq!((client.span_id, client.side, &*client.engine_kind), ([1; 8], Side::Client, "client"));
    assert_eq!(client.joined_span_id, Some([3; 8]));
    assert_eq!((&*client.model, &*client.model_source), ("served-m", "engine:span:gen_ai.response.model"));
    assert_eq!(&*client.request_model, "served-m");
    assert_eq!((client.ttft_s, client.e2e_s), (Some(0.3), Some(1.12)));
    assert!(client.segments.is_empty() && client.edge_span_id.is_none());
    assert_eq!((client.gateway_overhead_s, client.client_overhead_s), (None, None));
}

#[test]
fn a_nested_client_span_is_part_of_the_outer_call() {
    let outer = genai(1, CLIENT, &[("request_model", t("a"))]);
    let inner = genai(2, INTERNAL, &[("request_model", t("b"))]).parent(1);
    let record = one(&[inner, outer]);
    assert_eq!((record.span_id, &*record.model, record.side), ([1; 8], "a", Side::Client));
}

#[test]
fn a_genai_server_span_without_an_engine_is_a_request_of_its_own() {
    let answered = one(&[genai(1, SERVER, &[("response_model", t("x")), ("finish_reason", t("stop"))])]);
    assert_eq!((&*answered.outcome, &*answered.engine_kind, answered.edge_span_id), ("stop", "genai", None));
    assert_eq!(answered.e2e_s, Some(1.0)); // the span's own duration
    let aborted = one(&[genai(1, SERVER, &[("request_model", t("x"))])]);
    assert_eq!((&*aborted.outcome, &*aborted.error_type), (outcome::ABORT, "aborted"));
    assert_eq!(aborted.edge_span_id, Some([1; 8]));
    let failed = one(&[genai(1, SERVER, &[("response_model", t("x")), ("is_error", Value::Flag(true)),
                                          ("error_type", t("RateLimitError"))])]);
    assert_eq!((&*failed.outcome, &*failed.error_type), (outcome::ERROR, "RateLimitError"));
    // Behind another GenAI SERVER span: that one is its gateway, and no request of its own.
    let inner = genai(2, SERVER, &[("completion_tokens", i(3))]).parent(1);
    for spans in [[genai(1, SERVER, &[]), inner.clone()], [inner.clone(), genai(1, SERVER, &[])]] {
        let record = one(&spans);
        assert_eq!((record.span_id, record.edge_span_id), ([2; 8], Some([1; 8])));
    }
    // A gateway-only request whose numbers Python refuses raises out of Python's reading.
    let b = builder(RecordSettings::default());
    assert_eq!(declined(&b, &[genai(1, SERVER, &[("ttft_s", f(f64::NAN))])]), Decline::Uncaught);
}

// --- what the request's spans say ---------------------------------------------------------------

#[test]
fn the_model_is_resolved_in_its_order_and_named_by_its_source() {
    let settings = |rules: Vec<ResourceModelRule>, from_service: bool, default: &str| RecordSettings {
        resource_model_rules: rules, model_from_service_name: from_service, default_model: default.into(),
        ..RecordSettings::default()
    };
    let plain = builder(RecordSettings::default());
    let own = |values: &[(&'static str, Value)]| engine(2).obs(VLLM, with(vllm_values(), values));
    let model = |b: &RecordBuilder, spans: &[S]| {
        let r = one_with(b, spans);
        (r.model.into_owned(), r.model_source.into_owned(), r.request_model.into_owned(), r.response_model.into_owned())
    };
    let strings = |a: &str, b: &str, c: &str, d: &str| (a.to_owned(), b.to_owned(), c.to_owned(), d.to_owned());
    assert_eq!(model(&plain, &[own(&[("request_model", t("req")), ("response_model", t("resp"))])]),
               strings("resp", "span:gen_ai.response.model", "req", "resp"));
    // The span's request model, and the gateway's response model read beside it.
    let gateway = genai(1, SERVER, &[("response_model", t("gw-resp"))]).at(-10, 1050);
    assert_eq!(model(&plain, &[gateway.clone(), own(&[("request_model", t("req"))]).parent(1)]),
               strings("req", "span:gen_ai.request.model", "req", "gw-resp"));
    assert_eq!(model(&plain, &[gateway, own(&[]).parent(1)]),
               strings("gw-resp", "gateway:gen_ai.response.model", "gw-resp", "gw-resp"));
    // A parent no adapter's observation came with: its model attribute is read where ingest kept
    // its attributes (TGI's handler name on a span `_tgi` makes nothing of), not where it refused it.
    let unclaimed = span(1).name("generate").at(-10, 1050).attr("gen_ai.request.model", V::S("unclaimed"));
    assert_eq!(model(&plain, &[unclaimed.clone(), own(&[]).parent(1)]),
               strings("unclaimed", "gateway:gen_ai.request.model", "unclaimed", ""));
    assert_eq!(model(&plain, &[unclaimed.unkept(), own(&[]).parent(1)]), strings("", "none", "", ""));
    // The resource: mapped, taken as is, a rule that maps nothing passes to the next.
    let mapped = builder(settings(vec![
        ResourceModelRule { attribute: "service.name".into(), values: HashMap::from([("other".into(), "x".into())]) },
        ResourceModelRule { attribute: "service.name".into(),
                            values: HashMap::from([("vllm-qwen-0".into(), "Qwen".into())]) },
        ResourceModelRule { attribute: "model.id".into(), values: HashMap::new() },
    ], false, ""));
    assert_eq!(model(&mapped, &[own(&[]).service("vllm-qwen-0")]), strings("Qwen", "resource:service.name", "Qwen", ""));
    assert_eq!(model(&mapped, &[own(&[]).resource("model.id", V::S("from-resource"))]),
               strings("from-resource", "resource:model.id", "from-resource", ""));
    // An int resource attribute is no string: `_strings_of` keeps strings only.
    assert_eq!(model(&mapped, &[own(&[]).resource("model.id", V::I(7))]), strings("", "none", "", ""));
    // Fallbacks: the engine's service name (not an app's GenAI span, not unknown_service), the default.
    let fallback = builder(settings(vec![], true, "configured"));
    assert_eq!(model(&fallback, &[own(&[]).service("engine-a")]), strings("engine-a", "resource:service.name", "", ""));
    assert_eq!(model(&fallback, &[own(&[]).service("unknown_service:python")]),
               strings("configured", "default", "", ""));
    assert_eq!(model(&fallback, &[genai(1, SERVER, &[("completion_tokens", i(1))]).service("app")]),
               strings("configured", "default", "", ""));
    assert_eq!(model(&plain, &[own(&[])]), strings("", "none", "", ""));
}

#[test]
fn an_engines_record_names_the_model_it_served_before_what_its_callers_named() {
    let settings = |rules: Vec<ResourceModelRule>, from_service: bool, default: &str| RecordSettings {
        resource_model_rules: rules, model_from_service_name: from_service, default_model: default.into(),
        ..RecordSettings::default()
    };
    let model = |records: Vec<Record<'static>>, side: Side| {
        let r = records.into_iter().find(|r| r.side == side).expect("a record of that side");
        (r.model.into_owned(), r.model_source.into_owned(), r.request_model.into_owned(), r.response_model.into_owned())
    };
    let strings = |a: &str, b: &str, c: &str, d: &str| (a.to_owned(), b.to_owned(), c.to_owned(), d.to_owned());
    let served = |b: &RecordBuilder, gateway: &S, engine: S| model(run(b, &[gateway.clone(), engine.parent(1)]).0, Side::Server);
    // A gateway naming its caller's alias (request model), and the model it answered with.
    let alias = genai(1, SERVER, &[("request_model", t("alias"))]).at(-10, 1050);
    let answered = genai(1, SERVER, &[("request_model", t("alias")), ("response_model", t("alias-resp"))]).at(-10, 1050);
    let mapped = builder(settings(vec![
        ResourceModelRule { attribute: "service.name".into(), values: HashMap::from([("vllm-qwen-0".into(), "Qwen".into())]) },
        ResourceModelRule { attribute: "model.id".into(), values: HashMap::new() },
    ], false, ""));
    // The engine's resource rule names the label; what the gateway named is the request model, and
    // its response model is the response's.
    assert_eq!(served(&mapped, &alias, engine(2).service("vllm-qwen-0")), strings("Qwen", "resource:service.name", "alias", ""));
    assert_eq!(served(&mapped, &answered, engine(2).service("vllm-qwen-0")),
               strings("Qwen", "resource:service.name", "alias", "alias-resp"));
    assert_eq!(served(&mapped, &alias, engine(2).resource("model.id", V::S("from-resource"))),
               strings("from-resource", "resource:model.id", "alias", ""));
    // A response model alone is what was asked for too (`request or heard`).
    let response_only = genai(1, SERVER, &[("response_model", t("gw-resp"))]).at(-10, 1050);
    assert_eq!(served(&mapped, &response_only, engine(2).service("vllm-qwen-0")),
               strings("Qwen", "resource:service.name", "gw-resp", "gw-resp"));
    // A rule finding an empty string names nothing: the label falls back to what the gateway named.
    assert_eq!(served(&mapped, &alias, engine(2).resource("model.id", V::S(""))),
               strings("alias", "gateway:gen_ai.request.model", "alias", ""));
    // The engine's service name before the gateway's model; never the SDK's placeholder.
    let from_service = builder(settings(vec![], true, "configured"));
    assert_eq!(served(&from_service, &alias, engine(2).service("engine-a")),
               strings("engine-a", "resource:service.name", "alias", ""));
    for placeholder in ["unknown_service", "unknown_service:python", "unknown_servicex", ""] {
        assert_eq!(served(&from_service, &alias, engine(2).service(placeholder)),
                   strings("alias", "gateway:gen_ai.request.model", "alias", ""), "{placeholder:?}");
    }
    // Opted out of service names: the gateway's model, and the default only where nothing names one.
    let opt_out = builder(settings(vec![], false, "configured"));
    assert_eq!(served(&opt_out, &alias, engine(2).service("engine-a")),
               strings("alias", "gateway:gen_ai.request.model", "alias", ""));
    assert_eq!(model(run(&opt_out, &[engine(2).service("engine-a")]).0, Side::Server),
               strings("configured", "default", "", ""));
    // The engine's own span still comes first.
    let own = engine(2).obs(VLLM, with(vllm_values(), &[("response_model", t("served"))])).service("vllm-qwen-0");
    assert_eq!(served(&mapped, &alias, own), strings("served", "span:gen_ai.response.model", "alias", "served"));
    // A caller's span (a GenAI client's call through a gateway of its own) keeps §3's order: what
    // its joined spans name comes before its resource.
    let caller = genai(1, CLIENT, &[("request_model", t("asked"))]).at(-20, 1100);
    let gateway = genai(2, SERVER, &[("completion_tokens", i(3))]).parent(1).service("vllm-qwen-0");
    let (records, _) = run(&mapped, &[caller.clone(), gateway.clone()]);
    assert_eq!(model(records, Side::Server), strings("asked", "client:gen_ai.request.model", "asked", ""));
    let (records, _) = run(&builder(settings(vec![], true, "")), &[caller, gateway]);
    assert_eq!(model(records, Side::Server), strings("asked", "client:gen_ai.request.model", "asked", ""));
}

#[test]
fn operations_come_from_spans_routes_and_the_default() {
    let operation = |b: &RecordBuilder, spans: &[S]| {
        let r = one_with(b, spans);
        (r.operation_name.into_owned(), r.operation_source.into_owned())
    };
    let plain = builder(RecordSettings::default());
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    let own = |name: &'static str| engine(2).obs(VLLM, with(vllm_values(), &[("operation_name", t(name))]));
    assert_eq!(operation(&plain, &[own("embeddings")]), pair("embeddings", "span"));
    // A custom name gives way to a well-known one anywhere: the span's own route.
    assert_eq!(operation(&plain, &[own("acompletion").attr("http.route", V::S("/generate"))]),
               pair("text_completion", "route"));
    // url.path where http.route is empty; a double route is no route (and needs no repr).
    assert_eq!(operation(&plain, &[engine(2).attr("http.route", V::S("")).attr("url.path", V::S("/v1/embeddings"))]),
               pair("embeddings", "route"));
    assert_eq!(operation(&plain, &[engine(2).attr("http.route", V::D(0.5)).attr("url.path", V::S("/generate"))]),
               pair("", "default"));
    let gateway = |values: &[(&'static str, Value)]| genai(1, SERVER, values).at(-10, 1050);
    assert_eq!(operation(&plain, &[gateway(&[("operation_name", t("chat"))]), own("acompletion").parent(1)]),
               pair("chat", "gateway"));
    assert_eq!(operation(&plain, &[gateway(&[("operation_name", t("x"))]), own("acompletion").parent(1)]),
               pair("acompletion", "span"));
    assert_eq!(operation(&plain, &[gateway(&[("operation_name", t("x"))]), engine(2).parent(1)]), pair("x", "gateway"));
    let defaulted = builder(RecordSettings { default_operation: "chat".into(), ..RecordSettings::default() });
    assert_eq!(operation(&defaulted, &[engine(2)]), pair("chat", "default"));
}

#[test]
fn dimensions_tenants_and_lora_adapters_are_read_nearest_first() {
    let settings = RecordSettings {
        dimensions: vec![Dimension { name: "route".into(), attribute: "http.route".into(),
                                     allowed: HashSet::from(["/v1/chat/completions".to_owned()]), other: "other".into() }],
        tenant: Some(TenantRule { attributes: vec!["tenant.id".into(), "team".into()],
                                  allowed: HashSet::from(["team-a".to_owned()]), other: "others".into() }),
        lora_adapters: HashMap::from([("sql-lora".to_owned(), "base-model".to_owned())]),
        ..RecordSettings::default()
    };
    let b = builder(settings);
    let gateway = |route: V, tenant: V| genai(1, SERVER, &[]).at(-10, 1050).attr("http.route", route).attr("team", tenant);
    let r = one_with(&b, &[gateway(V::S("/v1/chat/completions"), V::S("team-a")), engine(2).parent(1)]);
    assert_eq!((r.dimensions, &*r.tenant), (vec![Cow::Borrowed("/v1/chat/completions")], "team-a"));
    let r = one_with(&b, &[gateway(V::S("/x"), V::S("team-b")), engine(2).parent(1)]);
    assert_eq!((r.dimensions, &*r.tenant), (vec![Cow::Borrowed("other")], "others"));
    // The span's own first, an empty value counts for a dimension but not for a tenant; then the resource.
    let own = engine(2).parent(1).attr("http.route", V::S("")).attr("tenant.id", V::S(""))
        .resource("tenant.id", V::S("team-a"));
    let r = one_with(&b, &[gateway(V::S("/v1/chat/completions"), V::S("team-b")), own]);
    assert_eq!((r.dimensions, &*r.tenant), (vec![Cow::Borrowed("other")], "others"));
    let r = one_with(&b, &[engine(2).resource("http.route", V::S("/v1/chat/completions")).resource("team", V::S("team-a"))]);
    assert_eq!((r.dimensions, &*r.tenant), (vec![Cow::Borrowed("/v1/chat/completions")], "team-a"));
    let r = one_with(&b, &[engine(2)]);
    assert_eq!((r.dimensions, &*r.tenant), (vec![Cow::Borrowed("other")], ""));
    // LoRA: the adapter named as the requested model.
    let r = one_with(&b, &[engine(2).obs(VLLM, with(vllm_values(), &[("request_model", t("sql-lora"))]))]);
    assert_eq!((&*r.lora_adapter, &*r.lora_base_model), ("sql-lora", "base-model"));
    assert_eq!((&*one_with(&b, &[engine(2)]).lora_adapter, ""), ("", ""));
    // A dimension or a tenant Python renders with `repr`: declined.
    assert_eq!(declined(&b, &[engine(2).attr("http.route", V::D(1.0))]), Decline::ReprText);
    assert_eq!(declined(&b, &[engine(2).attr("tenant.id", V::Array(vec![V::Array(vec![])]))]), Decline::ReprText);
    let r = one_with(&b, &[engine(2).attr("tenant.id", V::Array(vec![V::S("team-a"), V::S("x")]))]);
    assert_eq!(&*r.tenant, "team-a");
    let r = one_with(&b, &[engine(2).attr("tenant.id", V::B(true))]);
    assert_eq!(&*r.tenant, "others"); // "true"
}

#[test]
fn cache_and_speculative_decoding_are_read_beside_and_checked_against_the_prompt() {
    let gateway = genai(1, SERVER, &[("cached_tokens", i(4)), ("cache_write_tokens", i(2)),
                                     ("spec_accepted_tokens", i(3)), ("spec_draft_tokens", i(5)),
                                     ("spec_steps", i(2))]).at(-10, 1050);
    let r = one(&[gateway.clone(), engine(2).parent(1)]);
    assert_eq!((r.cached_tokens, r.cache_write_tokens), (Some(4), Some(2)));
    assert_eq!((r.spec_accepted_tokens, r.spec_draft_tokens, r.spec_steps), (Some(3), Some(5), Some(2)));
    // The engine's own win; counts its prompt cannot hold are rejected, the reason the span gave first.
    let own = engine(2).parent(1).obs(VLLM, with(vllm_values(), &[("cached_tokens", i(11)), ("cache_write_tokens", i(-1)),
                                                                  ("spec_decode_rejected", t("spec_decode_inconsistent"))]));
    let r = one(&[gateway, own]);
    assert_eq!((r.cached_tokens, r.cache_write_tokens), (None, None));
    assert_eq!(r.rejected, vec!["spec_decode_inconsistent", "cached_tokens_exceed_prompt", "cache_write_tokens_exceed_prompt"]);
    assert_eq!(r.spec_steps, Some(2));
    // The client side does not look beside: a client span's ancestors may sum several calls.
    let app = genai(1, SERVER, &[("cached_tokens", i(4))]).name("app");
    let (records, _) = run(&builder(RecordSettings::default()), &[app, genai(2, CLIENT, &[]).parent(1)]);
    let client = records.iter().find(|r| r.side == Side::Client).unwrap();
    assert_eq!(client.cached_tokens, None);
}

#[test]
fn overheads_and_span_times_that_measure_nothing_are_rejected() {
    let short = genai(1, SERVER, &[]).at(0, 900);
    let r = one(&[short, engine(2).parent(1)]);
    assert_eq!((r.gateway_overhead_s, r.rejected.clone()), (None, vec![Cow::Borrowed("negative_gateway_overhead")]));
    let client = genai(1, CLIENT, &[]).at(0, 999);
    let (records, _) = run(&builder(RecordSettings::default()), &[client, engine(2).parent(1)]);
    assert_eq!(records[0].rejected, vec!["negative_client_overhead"]);
    // A gateway without a start; an engine span ending before it starts, without an e2e of its own.
    let r = one(&[genai(1, SERVER, &[]).times(0, BASE), engine(2).parent(1)]);
    assert_eq!((r.gateway_overhead_s, r.rejected.clone()), (None, vec![Cow::Borrowed("invalid_span_times")]));
    let no_e2e: Vec<_> = vllm_values().into_iter().filter(|(n, _)| *n != "e2e_s").collect();
    let r = one(&[engine(2).obs(VLLM, no_e2e.clone()).times(BASE, BASE - 1)]);
    assert_eq!((r.e2e_s, r.rejected), (None, vec![Cow::Borrowed("invalid_span_times")]));
    let bounded = builder(RecordSettings { max_latency_s: 0.5, ..RecordSettings::default() });
    let r = one_with(&bounded, &[engine(2).obs(VLLM, no_e2e)]);
    assert_eq!((r.e2e_s, r.rejected), (None, vec![Cow::Borrowed("absurd_span_duration")]));
}

#[test]
fn the_edge_ttft_is_read_from_attributes_then_the_first_token_event() {
    let settings = RecordSettings { edge_ttft_attributes: vec!["x-ttft".into(), "gen_ai.server.time_to_first_token".into()],
                                    ..RecordSettings::default() };
    let b = builder(settings);
    let edge = |attrs: Vec<(&'static str, V)>| {
        let mut gateway = genai(1, SERVER, &[]).at(-10, 1050).event("other", BASE).event("first_token", BASE + 290 * MS)
            .event("gen_ai.first_token", BASE);
        gateway.attrs = attrs;
        one_with(&b, &[gateway, engine(2).parent(1)])
    };
    assert_eq!(edge(vec![("x-ttft", V::S("0.25"))]).edge_ttft_s, Some(0.25));
    assert_eq!(edge(vec![("gen_ai.server.time_to_first_token", V::I(2))]).edge_ttft_s, Some(2.0));
    // A list is no number (counted), the next key is read; a bool reads as nothing.
    let r = edge(vec![("x-ttft", V::Array(vec![V::D(0.1)])), ("gen_ai.server.time_to_first_token", V::D(0.2))]);
    assert_eq!((r.edge_ttft_s, r.rejected), (Some(0.2), vec![Cow::Borrowed("invalid_edge_ttft")]));
    // Out of bounds: rejected, and no event read after a value.
    let r = edge(vec![("x-ttft", V::D(-1.0))]);
    assert_eq!((r.edge_ttft_s, r.rejected), (None, vec![Cow::Borrowed("invalid_edge_ttft")]));
    // The first first-token event (from the gateway's start, 10 ms before BASE).
    let r = edge(vec![("x-ttft", V::B(true))]);
    assert_eq!(r.edge_ttft_s, Some(300_000_000f64 / 1e9));
    assert_eq!(declined(&b, &[genai(1, SERVER, &[]).at(-10, 1050).attr("x-ttft", V::S(" 1")), engine(2).parent(1)]),
               Decline::NumberText);
}

#[test]
fn sglang_requests_are_read_from_their_stage_spans() {
    let root_values = vec![("ttft_s", f(0.1)), ("e2e_s", f(1.0)), ("decode_s", f(0.8)), ("prefill_s", f(0.05)),
                           ("completion_tokens", i(17)), ("response_model", t("qwen")),
                           ("dispatch_to_first_token_s", f(0.03))];
    let root = span(1).kind(INTERNAL).name(" Req 5e58f074").obs(SGLANG_ROOT, root_values.clone());
    let thread = span(2).kind(INTERNAL).name("Scheduler").parent(1).at(0, 1000);
    let stage = |id: u8, name: &'static str, start: i64, end: i64| {
        span(id).kind(INTERNAL).name(name).parent(2).at(start, end).obs(STAGE, vec![])
    };
    let r = one(&[root.clone(), thread.clone(), stage(3, "tokenize", 0, 2), stage(4, "prefill_waiting", 10, 40),
                  stage(5, "prefill_forward", 40, 60), stage(6, "decode_forward", 60, 900)]);
    assert_eq!(r.queue_s, Some(30_000_000f64 / 1e9));
    assert_eq!(r.prefill_s, Some(20_000_000f64 / 1e9));
    assert_eq!(r.decode_s, Some(840_000_000f64 / 1e9));
    assert_eq!(r.inference_s, Some(20_000_000f64 / 1e9 + 840_000_000f64 / 1e9));
    assert_eq!(r.tpot_s, Some(840_000_000f64 / 1e9 / 16.0));
    assert_eq!(r.segments, vec![segment("preprocess", BASE, BASE + 2 * MS), segment("queue", BASE + 10 * MS, BASE + 40 * MS),
                                segment("prefill", BASE + 40 * MS, BASE + 60 * MS),
                                segment("decode", BASE + 60 * MS, BASE + 900 * MS),
                                segment("postprocess", BASE + 900 * MS, BASE + 1000 * MS)]);
    assert!(r.segments_missing.is_empty());
    assert_eq!((r.ttft_s, r.e2e_s, &*r.model), (Some(0.1), Some(1.0), "qwen"));
    // Retracted and queued again: the stage's spans summed (as Python's sum()), one interval.
    // (Durations a double holds exactly: the sum is one however `sum()` adds; see timings' tests.)
    let r = one(&[root.clone(), thread.clone(), stage(7, "prefill_waiting", 140, 265), stage(4, "prefill_waiting", 10, 135),
                  stage(5, "prefill_forward", 265, 300), stage(6, "decode_loop", 300, 900),
                  stage(8, "prefill_transfer_kv_cache", 301, 302)]);
    assert_eq!(r.queue_s, Some(0.25));
    assert_eq!(r.segments[0], segment("queue", BASE + 10 * MS, BASE + 265 * MS));
    assert_eq!(r.segments[3], segment("kv_transfer", BASE + 301 * MS, BASE + 302 * MS));
    // Without the scheduler's spans: the root's attributes, one queue_and_prefill interval.
    let r = one(&[root.clone(), thread.clone(), stage(3, "tokenize", 0, 2)]);
    assert_eq!(r.segments_missing, vec!["queue", "prefill"]);
    assert_eq!((r.queue_s, r.prefill_s, r.inference_s), (None, None, None));
    let handoff = BASE + ((0.1f64 - 0.03) * 1e9).round_ties_even() as u64;
    assert_eq!(r.segments, vec![segment("preprocess", BASE, handoff), segment("queue_and_prefill", handoff, BASE + 100 * MS),
                                segment("decode", BASE + 100 * MS, BASE + 900 * MS),
                                segment("postprocess", BASE + 900 * MS, BASE + 1000 * MS)]);
    assert_eq!(r.tpot_s, Some(0.8 / 16.0));
    // Aborted in the queue: a thread span closed with ERROR, no finish reason, no decode.
    let aborted_root = span(1).kind(INTERNAL).name(" Req 1").obs(SGLANG_ROOT, vec![("e2e_s", f(0.5))]);
    let r = one(&[aborted_root, thread.failed()]);
    assert_eq!((&*r.outcome, &*r.error_type), (outcome::ABORT, "aborted"));
    assert_eq!(r.segments_missing, vec!["queue", "prefill", "decode"]);
    assert!(r.segments.is_empty());
    // A stage span with impossible times: the request is malformed (counted), not built.
    let (records, malformed) = run(&builder(RecordSettings::default()), &[
        root, span(2).kind(INTERNAL).name("Scheduler").parent(1), stage(4, "prefill_waiting", 10, 5),
        stage(5, "prefill_forward", 40, 60)]);
    assert!(records.is_empty());
    assert_eq!(malformed, vec![("invalid_span_times", "svc".to_owned())]);
}

// --- what is malformed, and what is declined ---------------------------------------------------

#[test]
fn a_request_python_refuses_is_counted_malformed_and_the_others_built() {
    let b = builder(RecordSettings::default());
    let (records, malformed) = run(&b, &[engine(2).state("ot=th:zz").service("engine-a")]);
    assert!(records.is_empty());
    assert_eq!(malformed, vec![("invalid_sampling_threshold", "engine-a".to_owned())]);
    let nan = engine(3).obs(VLLM, with(vllm_values(), &[("ttft_s", f(f64::NAN))]));
    let (records, malformed) = run(&b, &[engine(2).state("ot=th:8"), nan.clone()]);
    assert_eq!((records.len(), records[0].weight), (1, 2.0));
    assert_eq!(malformed, vec![("nan_latency", "svc".to_owned())]);
    let absurd = engine(3).state("ot=th:ffffff");
    assert_eq!(run(&b, &[absurd]).1, vec![("absurd_sampling_threshold", "svc".to_owned())]);
}

#[test]
fn shapes_and_values_only_python_reads_are_declined() {
    let b = builder(RecordSettings::default());
    let triton = span(5).name("InferRequest").obs(TRITON, vec![("e2e_s", f(1.0))]);
    assert_eq!(declined(&b, &[engine(2), triton]), Decline::PythonShape);
    // SGLang's prefill and decode roots with one bootstrap room (an int and its string: one room).
    let root = |id: u8, name: &'static str, room: V| span(id).kind(INTERNAL).name(name).parent(9)
        .attr("bootstrap_room", room).obs(SGLANG_ROOT, vec![("e2e_s", f(1.0))]);
    assert_eq!(declined(&b, &[root(1, "prefill Req 1", V::I(7)), root(2, "decode Req 2", V::S("7"))]),
               Decline::DisaggregatedPair);
    let (records, _) = run(&b, &[root(1, "prefill Req 1", V::I(7)), root(2, "decode Req 2", V::S("8"))]);
    assert_eq!(records.len(), 2);
    // A double and an empty string both read "0": a pair.
    assert_eq!(declined(&b, &[root(1, "prefill Req 1", V::D(7.0)), root(2, "decode Req 2", V::S(""))]),
               Decline::DisaggregatedPair);
    let trtllm = |id: u8| span(id).parent(9).obs(TRTLLM_SHAPE, vec![("e2e_s", f(1.0))]);
    assert_eq!(declined(&b, &[trtllm(1), trtllm(2)]), Decline::DisaggregatedPair);
    assert_eq!(run(&b, &[trtllm(1), trtllm(2).parent(8)]).0.len(), 2);
    // A finish reason Unicode lowercasing could change; a time past i64; a non-ASCII trace state.
    let kelvin = engine(2).obs(VLLM, with(vllm_values(), &[("finish_reason", t("max_to\u{212a}ens"))]));
    assert_eq!(declined(&b, &[kelvin]), Decline::UnicodeCase);
    assert_eq!(declined(&b, &[engine(2).times(1 << 63, (1 << 63) + 1)]), Decline::TimeRange);
    assert_eq!(declined(&b, &[engine(2).state("ot=th:8\u{2003}")]), Decline::TraceState);
    // An observation of a shape the table does not hold.
    assert_eq!(declined(&b, &[engine(2).obs(99, vec![])]), Decline::UnknownShape);
}

#[test]
fn carried_fields_reach_the_record_unchanged() {
    let schema = schema();
    let custom = schema.id("x_custom_s").unwrap();
    let b = RecordBuilder::new(&schema, RecordSettings::default(), vec![(custom, FieldId(60))]).unwrap();
    let r = one_with(&b, &[engine(2).obs(VLLM, with(vllm_values(), &[("x_custom_s", f(2.5))]))]);
    assert_eq!(r.extra, vec![(FieldId(60), Value::Float(2.5))]);
    assert_eq!(r.get(crate::record::RecordField::Extra(FieldId(60))), Some(crate::record::FieldValue::Float(2.5)));
    assert!(one_with(&b, &[engine(2)]).extra.is_empty());
    assert!(RecordBuilder::new(&schema, RecordSettings::default(), vec![(FieldId(63), FieldId(1))]).is_err());
    let missing = Schema::new(vec![("ttft_s".into(), Kind::Float)]).unwrap();
    assert!(RecordBuilder::new(&missing, RecordSettings::default(), vec![]).is_err());
}

#[test]
fn a_late_span_is_measured_alone_and_a_late_client_call_on_its_client_side() {
    let b = builder(RecordSettings::default());
    let shapes = shapes();
    let late = |spans: &[S]| {
        let data = trace(spans);
        match b.build_late(&data, &shapes) {
            Built::Records(records, _) => Ok(records.iter().map(|r| (r.span_id, r.side)).collect::<Vec<_>>()),
            Built::Declined(reason) => Err(reason),
        }
    };
    assert_eq!(late(&[engine(2).parent(1)]), Ok(vec![([2; 8], Side::Server)]));
    assert_eq!(late(&[genai(3, CLIENT, &[("request_model", t("m"))]).parent(1)]), Ok(vec![([3; 8], Side::Client)]));
    assert_eq!(late(&[genai(3, SERVER, &[("request_model", t("m"))])]), Ok(vec![]));
    assert_eq!(late(&[span(3).parent(1)]), Ok(vec![]));
    assert_eq!(late(&[engine(2), engine(3)]), Err(Decline::LateShape));
    // A span only Python reads: declined where Python would read it, nothing where it reads nothing.
    assert_eq!(late(&[span(4).name("InferRequest").obs(TRITON, vec![])]), Err(Decline::PythonShape));
    assert_eq!(late(&[span(4).parent(3).obs(TRITON_MODEL, vec![])]), Ok(vec![]));
}

#[test]
fn hostile_parents_end_the_walks() {
    // A span that is its own parent, and two spans each the other's parent: bounded walks.
    let b = builder(RecordSettings::default());
    // Its own parent: its ancestors are itself 64 times, a SERVER span, so its own gateway.
    let r = one_with(&b, &[engine(2).parent(2)]);
    assert_eq!((r.edge_span_id, r.gateway_overhead_s), (Some([2; 8]), Some(0.0)));
    // Gateway and engine each the other's parent: ancestors 1, 2, 1, ... 2 (64); the last the edge,
    // and the gateway, looked up by the engine, no request of its own.
    let (records, _) = run(&b, &[genai(1, SERVER, &[]).parent(2).at(-10, 1050), engine(2).parent(1)]);
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].span_id, records[0].edge_span_id), ([2; 8], Some([2; 8])));
    // A client span in a cycle with its own GenAI child: each is the other's ancestor.
    let (records, _) = run(&b, &[genai(1, CLIENT, &[]).parent(3), genai(3, CLIENT, &[]).parent(1)]);
    assert!(records.is_empty());
}

#[test]
fn the_general_joining_agrees_with_the_simple_shapes() {
    let b = builder(RecordSettings { model_from_service_name: true, ..RecordSettings::default() });
    let shapes = shapes();
    let cases: Vec<Vec<S>> = vec![
        vec![engine(2)],
        vec![engine(2).parent(9)],
        vec![engine(2), span(3).kind(INTERNAL).name("x").parent(2)],
        vec![genai(1, SERVER, &[("finish_reason", t("stop"))]).at(-1, 1001).failed(), engine(2).parent(1)],
        vec![engine(2).parent(1), genai(1, SERVER, &[]).parent(9).at(-1, 999)],
    ];
    for spans in cases {
        let data = trace(&spans);
        let view = TraceView::new(&b, &data, &shapes);
        assert!(view.simple_request().is_some());
        assert_eq!(view.records_of_any_trace().unwrap(), view.records_of_trace().unwrap());
    }
    // Shapes the simple reading must leave to the general one.
    for spans in [vec![engine(2).parent(2)], vec![engine(2), engine(3)], vec![genai(1, CLIENT, &[]), engine(2).parent(1)],
                  vec![span(8), genai(1, SERVER, &[]).parent(8), engine(2).parent(1)]] {
        let data = trace(&spans);
        assert!(TraceView::new(&b, &data, &shapes).simple_request().is_none());
    }
}

#[test]
fn tgi_requests_lay_validation_queue_and_inference() {
    let tgi = span(2).name("generate").obs(TGI, vec![("e2e_s", f(1.0)), ("preprocess_s", f(0.0)), ("queue_s", f(0.25)),
                                                     ("inference_s", f(0.5)), ("operation_name", t("text_completion"))]);
    let r = one(&[tgi]);
    assert_eq!((&*r.engine_kind, &*r.operation_name, r.ttft_s, r.tpot_s), ("tgi", "text_completion", None, None));
    assert_eq!(r.segments, vec![segment("queue", BASE, BASE + 250 * MS), segment("inference", BASE + 250 * MS, BASE + 750 * MS),
                                segment("postprocess", BASE + 750 * MS, BASE + 1000 * MS)]);
    // A bytes attribute reads as its hex.
    let settings = RecordSettings { tenant: Some(TenantRule { attributes: vec!["tenant.id".into()],
                                                              allowed: HashSet::from(["ab01".to_owned()]),
                                                              other: "o".into() }),
                                    ..RecordSettings::default() };
    let r = one_with(&builder(settings), &[engine(2).attr("tenant.id", V::Bytes(&[0xab, 0x01]))]);
    assert_eq!(&*r.tenant, "ab01");
}

// --- properties on random traces ------------------------------------------------------------------

mod properties {
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 8] = ["llm_request", " Req 1", "prefill_forward", "decode_forward", "chat m", "POST /x",
                              "handler", "prefill_waiting"];
    const TEXTS: [&str; 5] = ["", "m", "stop", "chat", "acompletion"];

    fn value_strategy() -> impl Strategy<Value = V> {
        prop_oneof![
            prop::sample::select(vec!["/v1/chat/completions", "/generate", "", "x", "0.5"]).prop_map(V::S),
            any::<i64>().prop_map(V::I),
            prop::sample::select(vec![0.25, -1.0, f64::NAN, f64::INFINITY, 1e300]).prop_map(V::D),
            any::<bool>().prop_map(V::B),
        ]
    }

    fn float_strategy() -> impl Strategy<Value = Option<f64>> {
        prop::option::of(prop::sample::select(vec![0.0, 0.001, 0.25, 1.0, 3.5, -0.5, f64::NAN, f64::INFINITY, 1e300]))
    }

    prop_compose! {
        fn span_strategy()(id in 1u8..9, parent in prop::option::of(0u8..10), kind in 0i32..4, name in 0usize..8,
                           start in prop::sample::select(vec![0u64, BASE, BASE + 7 * MS, u64::MAX - 1]),
                           length in prop::sample::select(vec![0i64, 1_000_000, 900_000_000, -5, 1 << 62]),
                           failed in any::<bool>(), shape in prop::option::of(0u16..7), kept in any::<bool>(),
                           floats in prop::collection::vec(float_strategy(), 9),
                           ints in prop::collection::vec(prop::option::of(-2i64..30), 6),
                           texts in prop::collection::vec(prop::option::of(0usize..5), 5),
                           attrs in prop::collection::vec((0usize..5, value_strategy()), 0..3),
                           state in prop::sample::select(vec!["", "ot=th:8", "ot=th:zz", "ot=th:ffffff"]))
                          -> S {
            let keys = ["http.route", "url.path", "error.type", "gen_ai.server.time_to_first_token", "tenant.id"];
            let float_names = ["ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s", "preprocess_s",
                               "tpot_s", "dispatch_to_first_token_s"];
            let int_names = ["prompt_tokens", "completion_tokens", "max_tokens", "cached_tokens", "cache_write_tokens",
                             "spec_steps"];
            let text_names = ["request_model", "response_model", "finish_reason", "operation_name", "error_type"];
            let mut s = span(id).kind(kind).name(NAMES[name]).times(start, start.wrapping_add_signed(length)).state(state);
            s.parent = parent;
            if failed {
                s = s.failed();
            }
            for (key, value) in attrs {
                s = s.attr(keys[key], value);
            }
            if !kept {
                s = s.unkept(); // no candidate, or refused (an observed span's is reset by its shape)
            }
            if let Some(shape) = shape {
                let mut values = Vec::new();
                for (name, value) in float_names.iter().zip(floats) {
                    if let Some(value) = value {
                        values.push((*name, f(value)));
                    }
                }
                for (name, value) in int_names.iter().zip(ints) {
                    if let Some(value) = value {
                        values.push((*name, i(value)));
                    }
                }
                for (name, value) in text_names.iter().zip(texts) {
                    if let Some(value) = value {
                        values.push((*name, t(TEXTS[value])));
                    }
                }
                s = s.obs(if shape == TRITON { TGI } else { shape }, values);
            }
            s
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]

        /// Whatever the trace, the builder answers (no panic), the same every time; each record is a
        /// request of one of its observed spans (server records of engine or GenAI SERVER spans,
        /// client records of outermost GenAI client spans), and where the simple reading takes the
        /// trace, the general joining reads it the same.
        #[test]
        fn every_trace_is_built_or_declined_and_every_record_is_a_request(spans in prop::collection::vec(span_strategy(), 1..10)) {
            let data = trace(&spans);
            let shapes = shapes();
            let b = builder(RecordSettings { model_from_service_name: true, ..RecordSettings::default() });
            let first = b.build(&data, &shapes);
            prop_assert_eq!(&first, &b.build(&data, &shapes));
            let view = TraceView::new(&b, &data, &shapes);
            if view.simple_request().is_some() {
                prop_assert_eq!(view.records_of_any_trace(), view.records_of_trace());
            }
            if let Built::Records(records, malformed) = first {
                let requests = (0..data.len()).filter(|&at| view.shape(at).is_some_and(|s| s.part.is_empty())).count();
                prop_assert!(records.len() + malformed.len() <= requests);
                for record in &records {
                    let at = data.find(&record.span_id).unwrap();
                    let shape = view.shape(at).unwrap();
                    prop_assert!(shape.part.is_empty());
                    match record.side {
                        Side::Client => {
                            prop_assert!(shape.may_be_gateway && data.span(at).kind != SERVER);
                            prop_assert!(record.segments.is_empty() && record.edge_span_id.is_none());
                        }
                        Side::Server => prop_assert!(!shape.may_be_gateway || data.span(at).kind == SERVER),
                    }
                    prop_assert!(record.e2e_s.is_none_or(|e2e| e2e >= 0.0));
                    prop_assert!(record.weight >= 1.0 && record.weight <= 1_048_576.0);
                    prop_assert!(record.segments.windows(2).all(|w| w[0].start_unix_ns <= w[1].start_unix_ns)
                                 || shape.engine_kind != "sglang");
                }
            }
        }
    }
}
