//! The engine on hand-built export requests: a small shape table (a vLLM-like engine span, a
//! shape only Python reads), one naming, a sampler keeping slow and failed requests.

use super::*;
use crate::decide::{PolicyConfig, PolicyMetric, Rule};
use crate::model::{Kind, SPAN_KIND_INTERNAL, SPAN_KIND_SERVER, STATUS_CODE_ERROR};
use crate::record::{RecordField as F, Side};
use crate::series::{CounterSpec, HistogramSpec, LabelSource, NamingSpec, Number, SegmentsSpec, ValueSpec};
use crate::shapes::Read;
use crate::wire::push_varint;

const BASE: u64 = 1_767_225_600_000_000_000;
const MS: u64 = 1_000_000;

/// The native observation schema (as `records/tests.rs` declares it).
fn schema() -> Schema {
    let mut fields: Vec<(String, Kind)> = Vec::new();
    for name in ["ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s", "preprocess_s", "tpot_s",
                 "dispatch_to_first_token_s"] {
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

/// Shape 0: an engine's request span (`llm_request` with an `e2e` attribute); shape 1: a
/// composite engine's root only Python reads records of (`InferRequest`).
fn config(shards: usize) -> EngineConfig {
    let schema = schema();
    let id = |name: &str| schema.id(name).unwrap();
    let reads = vec![
        (vec![id("is_error"), id("error_type")], Read::Error),
        (vec![id("e2e_s")], Read::Seconds(vec!["e2e".into()])),
        (vec![id("prompt_tokens")], Read::Count(vec!["prompt".into()])),
        (vec![id("response_model")], Read::Text(vec!["model".into()])),
    ];
    let shape = |adapter: &str, kind: &str, python: bool| ShapeDef {
        info: ShapeInfo { adapter: adapter.into(), engine_kind: kind.into(), python_records: python,
                          ..ShapeInfo::default() },
        reads: reads.clone(),
        afterwards: Vec::new(),
        python_reading: false,
        reads_attributes: true,
    };
    let rules = vec![
        RuleDef { shape: Some(0), names: vec!["llm_request".into()], present: vec!["e2e".into()], ..RuleDef::default() },
        RuleDef { malformed: Some("missing_latency".into()), names: vec!["llm_request".into()], ..RuleDef::default() },
        RuleDef { shape: Some(1), names: vec!["InferRequest".into()], present: vec!["e2e".into()], ..RuleDef::default() },
    ];
    let candidates = Candidates { names: vec!["llm_request".into(), "InferRequest".into()], ..Candidates::default() };
    let naming = NamingSpec {
        key: "vllm".into(),
        side: Side::Server,
        label_names: vec!["model_name".into(), "engine_kind".into(), "service_name".into()],
        labels: vec![LabelSource::Field(F::Model), LabelSource::Field(F::EngineKind), LabelSource::Field(F::ServiceName)],
        histograms: vec![HistogramSpec {
            name: "e2e".into(), unit: "s".into(), description: "Latency.".into(), buckets: vec![0.5, 1.0, 2.0],
            value: ValueSpec::Field(F::E2eS), success_only: false, fixed_label: None, per_step: None,
            buckets_by_model: Vec::new(),
        }],
        counters: vec![CounterSpec {
            name: "requests".into(), unit: "{request}".into(), description: "Requests.".into(),
            value: ValueSpec::Constant(Some(Number::Int(1))), by_outcome: true, fixed_label: None,
        }],
        schema_url: String::new(),
    };
    let metrics = MetricsSpec {
        namings: vec![naming],
        segments: SegmentsSpec { name: "otel_llm_request_segment_seconds".into(), unit: "s".into(),
                                 description: "Segments.".into(), buckets: vec![0.1, 1.0] },
        dimension_names: Vec::new(),
        series_limit: 100,
        series_limit_bytes: 1 << 24,
        max_label_value_bytes: 256,
        exponential: None,
    };
    let sampler = SamplerConfig {
        policies: vec![
            PolicyConfig { name: "errors".into(), rule: Rule::Errors },
            PolicyConfig { name: "slow".into(),
                           rule: Rule::Slo { thresholds: vec![(PolicyMetric::E2e, 1.5)], per_model: Vec::new() } },
        ],
        traces_per_second: 0.0,
        per_model_traces_per_second: 0.0,
        applies_to: Vec::new(),
        max_models: 1000,
    };
    EngineConfig {
        table: TableConfig { schema, shapes: vec![shape("vllm_v1", "vllm", false), shape("triton_root", "triton", true)],
                             rules, candidates },
        ingest: IngestSettings { max_attributes: 128, max_value_bytes: 1 << 20, max_latency_s: 86400.0,
                                 max_tokens: 10_000_000, abs_tolerance_s: 0.001, rel_tolerance: 0.01 },
        assembly: AssemblySettings { decision_wait_s: 10.0, grace_s: 1.0, max_traces: 1000, ..AssemblySettings::default() },
        records: RecordSettings::default(),
        carried: Vec::new(),
        sampler: Some(sampler),
        metrics,
        accounting: None,
        redaction: Redaction::default(),
        write_kept: true,
        shards,
        clock_start_s: 0.0,
    }
}

fn engine(shards: usize) -> Engine {
    Engine::new(config(shards)).unwrap()
}

// --- request bytes -------------------------------------------------------------------------------

fn message(out: &mut Vec<u8>, tag: u8, data: &[u8]) {
    out.push(tag);
    push_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

enum V {
    S(&'static str),
    D(f64),
    I(i64),
}

fn key_value(key: &str, value: &V) -> Vec<u8> {
    let mut any = Vec::new();
    match value {
        V::S(text) => message(&mut any, 0x0a, text.as_bytes()),
        V::I(int) => {
            any.push(0x18);
            push_varint(&mut any, *int as u64);
        }
        V::D(double) => {
            any.push(0x21);
            any.extend_from_slice(&double.to_le_bytes());
        }
    }
    let mut out = Vec::new();
    message(&mut out, 0x0a, key.as_bytes());
    message(&mut out, 0x12, &any);
    out
}

/// A span of trace `trace` (its id: 16 times the byte), id `[id; 8]`.
struct S {
    trace: u8,
    id: u8,
    parent: Option<u8>,
    name: &'static str,
    kind: i32,
    status: i32,
    attrs: Vec<(&'static str, V)>,
}

fn span(trace: u8, id: u8, name: &'static str) -> S {
    S { trace, id, parent: None, name, kind: SPAN_KIND_SERVER, status: 0, attrs: Vec::new() }
}

/// An engine's request span of `e2e` seconds, model "m".
fn engine_span(trace: u8, id: u8, e2e: f64) -> S {
    span(trace, id, "llm_request").attr("e2e", V::D(e2e)).attr("prompt", V::I(10)).attr("model", V::S("m"))
}

impl S {
    fn attr(mut self, key: &'static str, value: V) -> S {
        self.attrs.push((key, value));
        self
    }
    fn parent(mut self, parent: u8) -> S {
        self.parent = Some(parent);
        self
    }
    fn internal(mut self) -> S {
        self.kind = SPAN_KIND_INTERNAL;
        self
    }
    fn failed(mut self) -> S {
        self.status = STATUS_CODE_ERROR;
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        message(&mut out, 0x0a, &[self.trace; 16]);
        message(&mut out, 0x12, &[self.id; 8]);
        if let Some(parent) = self.parent {
            message(&mut out, 0x22, &[parent; 8]);
        }
        message(&mut out, 0x2a, self.name.as_bytes());
        out.push(0x30);
        push_varint(&mut out, self.kind as u64);
        out.push(0x39);
        out.extend_from_slice(&BASE.to_le_bytes());
        out.push(0x41);
        out.extend_from_slice(&(BASE + 1000 * MS).to_le_bytes());
        for (key, value) in &self.attrs {
            message(&mut out, 0x4a, &key_value(key, value));
        }
        if self.status != 0 {
            message(&mut out, 0x7a, &[0x18, self.status as u8]);
        }
        out
    }
}

/// An `ExportTraceServiceRequest` of one resource (`service.name` "svc") and one scope.
fn request(spans: &[S]) -> Vec<u8> {
    let mut resource = Vec::new();
    message(&mut resource, 0x0a, &key_value("service.name", &V::S("svc")));
    let mut scope_spans = Vec::new();
    for span in spans {
        message(&mut scope_spans, 0x12, &span.bytes());
    }
    let mut resource_spans = Vec::new();
    message(&mut resource_spans, 0x0a, &resource);
    message(&mut resource_spans, 0x12, &scope_spans);
    let mut out = Vec::new();
    message(&mut out, 0x0a, &resource_spans);
    out
}

fn ingest(engine: &Engine, spans: &[S], now: f64) -> IngestCounts {
    match engine.ingest(&request(spans), false, now).expect("a request") {
        IngestSummary::Native(counts) => counts,
        IngestSummary::Python => panic!("read by Python"),
    }
}

fn lines_with(text: &str, needle: &str) -> Vec<String> {
    text.lines().filter(|line| line.contains(needle)).map(str::to_owned).collect()
}

// --- the tests -----------------------------------------------------------------------------------

#[test]
fn an_engine_is_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Engine>();
}

#[test]
fn ingest_counts_what_the_adapter_stage_and_the_buffer_counted() {
    let engine = engine(1);
    let counts = ingest(&engine, &[engine_span(1, 1, 0.5), span(1, 2, "db").internal().parent(1),
                                    span(2, 1, "llm_request"), engine_span(1, 1, 0.5)], 0.0);
    assert_eq!(counts.matched, vec![("vllm_v1".to_owned(), 2)]);
    assert_eq!(counts.malformed, vec![("missing_latency".to_owned(), "svc".to_owned(), 1)]);
    assert_eq!(counts.passed_through, 2); // the db span and the refused one
    assert_eq!((counts.buffered, counts.duplicate, counts.invalid_ids), (4, 1, 0));
    assert_eq!((engine.len(), engine.held_spans()), (2, 3));
    assert!(engine.heap_bytes() > 0);
    // All-zero ids are refused as the receivers refuse them: counted, not buffered.
    let counts = ingest(&engine, &[engine_span(0, 1, 0.5)], 0.0);
    assert_eq!((counts.invalid_ids, counts.buffered), (1, 0));
    assert_eq!(engine.counters().requests_native, 2);
}

#[test]
fn records_are_rendered_and_kept_traces_written_once_decided() {
    let engine = engine(1);
    ingest(&engine, &[engine_span(1, 1, 0.5)], 0.0);
    ingest(&engine, &[engine_span(2, 1, 2.0)], 0.0);
    ingest(&engine, &[engine_span(3, 1, 0.25).failed()], 0.0);
    // Ready at once (a lone engine span is rooted), due after the grace.
    assert_eq!(engine.tick_at(0.5, 100.0).completions(), 0);
    let out = engine.tick_at(1.5, 100.0);
    assert_eq!(out.completed, vec![(Reason::Ready, 3)]);
    assert_eq!((out.records_built, out.records_measured), (3, 3));
    assert_eq!((out.kept_decisions, out.dropped_decisions, out.rate_limited), (2, 1, 0));
    assert_eq!(out.assembled, vec![(("vllm".to_owned(), "unknown".to_owned()), 2),
                                   (("vllm".to_owned(), "error".to_owned()), 1)]);
    assert!(out.declined.is_empty() && out.kept_declined.is_empty());
    let kept: Vec<(TraceId, String)> = out.kept.iter().map(|k| (k.trace_id, engine.name(k.decision.policy))).collect();
    assert_eq!(kept, vec![([2; 16], "slow".to_owned()), ([3; 16], "errors".to_owned())]);
    let written = &out.kept[0];
    assert_eq!((written.written.spans, written.written.rows.len()), (1, 1));
    assert_eq!(written.written.rows[0].span_id, "0101010101010101");
    assert!(!written.written.request.is_empty());
    assert_eq!(written.records.len(), 1);
    assert_eq!(engine.requests_recorded(), 3);

    let text = engine.render(false);
    assert_eq!(lines_with(&text, "e2e_seconds_count"), vec![
        "e2e_seconds_count{engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"} 3.0"]);
    assert_eq!(lines_with(&text, "e2e_seconds_sum"), vec![
        "e2e_seconds_sum{engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"} 2.75"]);
    assert!(text.contains("# HELP otel_llm_series_overflow"), "{text}");
    // Exemplars (OpenMetrics) name kept traces only.
    let openmetrics = engine.render(true);
    assert!(openmetrics.contains(&"02".repeat(16)), "{openmetrics}");
    assert!(!openmetrics.contains(&"01".repeat(16)), "{openmetrics}");
    let snapshot = engine.snapshot();
    assert!(!snapshot.series.families.is_empty() && snapshot.accounting.is_empty());
    let counters = engine.counters();
    assert_eq!((counters.completed(Reason::Ready), counters.kept, counters.dropped, counters.kept_written), (3, 2, 1, 2));
    assert_eq!(engine.len(), 0);
}

#[test]
fn decisions_are_remembered_and_late_spans_follow_them() {
    let engine = engine(1);
    ingest(&engine, &[engine_span(1, 1, 0.5)], 0.0);
    ingest(&engine, &[engine_span(2, 1, 2.0)], 0.0);
    engine.tick_at(2.0, 100.0);
    let kept = engine.remembered(&[2; 16]).expect("remembered");
    assert!(kept.decision.keep);
    assert_eq!(kept.measured.as_slice(), &[[1; 8]]);
    assert!(!engine.remembered(&[1; 16]).expect("remembered").decision.keep);
    // Late spans: a child of each trace, and the kept trace's engine span again (measured: a duplicate).
    let counts = ingest(&engine, &[span(2, 2, "db").internal().parent(1), span(1, 2, "db").internal().parent(1),
                                   engine_span(2, 1, 2.0)], 3.0);
    assert_eq!((counts.duplicate, counts.late, counts.parked, counts.completed_to_make_room), (1, 2, 0, 0));
    assert_eq!(engine.len(), 0);
    let out = engine.tick_at(3.0, 100.0);
    assert_eq!((out.late, out.completed.len()), (2, 0));
    assert_eq!(out.kept.len(), 1);
    assert_eq!(out.kept[0].trace_id, [2; 16]);
    assert_eq!(out.kept[0].written.rows[0].span_id, "0202020202020202");
    assert_eq!((out.records_built, out.records_measured), (0, 0));
    assert_eq!(engine.counters().late, 2);
    // A late engine span of the kept trace (another request) is measured alone, and kept.
    ingest(&engine, &[engine_span(2, 3, 1.0).parent(1)], 4.0);
    let out = engine.tick_at(4.0, 100.0);
    assert_eq!((out.late, out.records_measured, out.kept.len()), (1, 1, 1));
    assert!(engine.remembered(&[2; 16]).unwrap().measured.contains(&[3; 8]));
    assert_eq!(engine.requests_recorded(), 3);
}

#[test]
fn declined_traces_go_to_python_and_their_late_spans_wait_for_resume() {
    let engine = engine(1);
    ingest(&engine, &[span(5, 1, "InferRequest").attr("e2e", V::D(1.0)), engine_span(6, 1, 0.5)], 0.0);
    let out = engine.tick_at(2.0, 100.0); // the Triton root is an engine's own request span: ready
    assert_eq!(out.completed, vec![(Reason::Ready, 2)]);
    assert_eq!(out.declined.len(), 1);
    let (completion, reason) = &out.declined[0];
    assert_eq!((completion.trace.trace_id, completion.reason, *reason),
               ([5; 16], Reason::Ready, crate::records::Decline::PythonShape));
    assert_eq!((out.records_measured, engine.counters().declined), (1, 1));
    // While Python decides, a late span of it waits (parked) ...
    let counts = ingest(&engine, &[span(5, 2, "db").internal().parent(1)], 21.0);
    assert_eq!((counts.late, counts.parked), (0, 1));
    assert_eq!(engine.tick_at(21.0, 100.0).completions(), 0);
    // ... and follows the decision Python resumes (the engine's sampler decides Python's records).
    let mut slow = Record::new([5; 16], [1; 8]);
    slow.e2e_s = Some(2.0);
    let decided = engine.decide(&completion.trace, &[slow], 21.0).unwrap();
    assert_eq!((decided.keep, engine.name(decided.policy)), (true, "slow".to_owned()));
    assert_eq!(engine.counters().kept, 1);
    let decision = Decision { keep: true, rate_limited: false, policy: engine.intern("python"), threshold: NameId(0) };
    engine.resume(&[5; 16], decision, &[]);
    engine.add_measured(&[5; 16], [7; 8]);
    assert_eq!(engine.remembered(&[5; 16]).unwrap().measured.as_slice(), &[[7; 8]]);
    let out = engine.tick_at(22.0, 100.0);
    assert_eq!(out.late, 1);
    assert_eq!(out.kept.len(), 1);
    assert_eq!((out.kept[0].trace_id, engine.name(out.kept[0].decision.policy)), ([5; 16], "python".to_owned()));
    // Python's records of the declined trace are recorded into the engine's series.
    let mut record = Record::new([5; 16], [1; 8]);
    (record.model, record.engine_kind, record.service_name) = ("t".into(), "triton".into(), "svc".into());
    record.e2e_s = Some(1.0);
    engine.record(&[record], true, 100.0);
    assert_eq!(engine.requests_recorded(), 2);
    assert_eq!(lines_with(&engine.render(false), "e2e_seconds_count{engine_kind=\"triton\""), vec![
        "e2e_seconds_count{engine_kind=\"triton\",model_name=\"t\",service_name=\"svc\"} 1.0"]);
}

#[test]
fn sharding_gives_the_render_of_one_shard() {
    let one = engine(1);
    let four = engine(4);
    assert_eq!(four.shards(), 4);
    let e2e = [0.25, 0.5, 2.0, 0.75, 4.0, 1.0, 0.125, 3.0];
    for (round, chunk) in e2e.chunks(3).enumerate() {
        let spans: Vec<S> = chunk.iter().enumerate()
            .flat_map(|(i, &e)| {
                let trace = (round * 3 + i + 1) as u8;
                [engine_span(trace, 1, e), span(trace, 2, "db").internal().parent(1)]
            })
            .collect();
        let now = round as f64;
        assert_eq!(ingest(&one, &spans, now), ingest(&four, &spans, now));
    }
    assert_eq!((one.len(), four.len()), (8, 8));
    let (a, b) = (one.tick_at(30.0, 100.0), four.tick_at(30.0, 100.0));
    assert_eq!((a.records_measured, a.kept_decisions, a.kept.len()), (b.records_measured, b.kept_decisions, b.kept.len()));
    assert_eq!(a.kept_decisions, 3);
    assert_eq!(one.render(false), four.render(false));
    assert_eq!(one.counters(), four.counters());
}

#[test]
fn concurrent_ingests_and_ticks_lose_nothing() {
    let engine = engine(2);
    std::thread::scope(|scope| {
        for thread in 0..2u8 {
            let engine = &engine;
            scope.spawn(move || {
                for i in 0..20u8 {
                    ingest(engine, &[engine_span(1 + thread * 20 + i, 1, 0.5)], 0.0);
                    engine.tick_at(0.5, 100.0);
                }
            });
        }
    });
    let out = engine.tick_at(5.0, 100.0);
    assert_eq!(out.records_measured, 40);
    assert_eq!(engine.requests_recorded(), 40);
    assert_eq!(engine.counters().completed(Reason::Ready), 40);
}

#[test]
fn shed_and_drain_complete_pending_traces_at_the_next_tick() {
    let engine = engine(1);
    for trace in 1..=4 {
        ingest(&engine, &[span(trace, 1, "gateway")], 0.0);
    }
    assert_eq!(engine.shed(0.5), 2);
    assert_eq!(engine.drain(), 2);
    let out = engine.tick_at(0.0, 100.0);
    assert_eq!(out.completed, vec![(Reason::MemoryPressure, 2), (Reason::Shutdown, 2)]);
    assert_eq!((out.records_built, out.dropped_decisions), (0, 4));
    assert_eq!(engine.held(), 0);
}

#[test]
fn absurd_input_and_settings_are_refused_not_a_crash() {
    let engine = engine(3);
    for bytes in [&b"\xff\xff\xff\xff"[..], &[0x0a, 0x80], &[0x0a, 5, 1, 2]] {
        assert!(engine.ingest(bytes, false, 0.0).is_err(), "{bytes:?}");
    }
    assert_eq!(engine.ingest(&[], false, 0.0).ok(), Some(IngestSummary::Native(IngestCounts::default())));
    ingest(&engine, &[engine_span(1, 1, 0.5)], 0.0);
    assert_eq!(engine.shed(f64::NAN), 0);
    assert_eq!(engine.shed(-1.0), 0);
    let _ = engine.tick_at(f64::NAN, f64::NAN);
    let _ = engine.tick_at(f64::INFINITY, 0.0);
    assert_eq!(engine.completion_lag(f64::NAN), 0.0);
    // A NaN latency is Python's to refuse: the request goes to Python, not into the buffer.
    let nan = engine.ingest(&request(&[engine_span(2, 1, f64::NAN)]), false, 0.0);
    assert_eq!(nan.ok(), Some(IngestSummary::Python));

    let refused = |change: &dyn Fn(&mut EngineConfig), word: &str| {
        let mut bad = config(1);
        change(&mut bad);
        let error = Engine::new(bad).err().expect("refused");
        assert!(error.contains(word), "{error}");
    };
    refused(&|c| c.shards = 0, "shards");
    refused(&|c| c.shards = 5000, "shards");
    refused(&|c| c.assembly.max_traces = 0, "shards");
    refused(&|c| c.table.schema = Schema::new(vec![("ttft_s".into(), Kind::Float)]).unwrap(), "schema");
    refused(&|c| c.metrics.namings[0].histograms[0].name = "bad name".into(), "llm_metrics");
    refused(&|c| {
        c.sampler.as_mut().unwrap().policies[1].rule =
            Rule::Slowest { metrics: vec![PolicyMetric::E2e], quantile: 0.5, window_s: 0.0 };
    }, "tail_sampling");
    refused(&|c| c.redaction.key_patterns = vec!["[ab]*".into()], "redaction");
}

#[test]
fn without_tail_sampling_every_trace_is_kept_unsampled() {
    let mut config = config(1);
    config.sampler = None;
    let engine = Engine::new(config).unwrap();
    ingest(&engine, &[engine_span(1, 1, 0.5)], 0.0);
    let out = engine.tick_at(2.0, 100.0);
    assert_eq!((out.kept_decisions, out.kept.len()), (1, 1));
    assert_eq!(out.kept[0].decision, KEEP_UNSAMPLED);
}

#[test]
fn accounting_is_rendered_beside_the_series() {
    use crate::accounting::{AccountingSpec, Objectives};
    let spec = |name: &str, labels: &[&str]| AccountingSpec {
        name: name.into(), description: "D.".into(), label_names: labels.iter().map(|l| l.to_string()).collect(),
    };
    let mut config = config(1);
    config.accounting = Some(AccountingConfig {
        settings: AccountingSettings {
            default_objectives: Some(Objectives { e2e_s: Some(1.0), ..Objectives::default() }),
            ..AccountingSettings::default()
        },
        specs: AccountingSpecs {
            tenant_tokens: spec("otel_llm_tenant_tokens", &["model_name", "tenant", "token_type"]),
            request_cost: spec("otel_llm_request_cost", &["model_name", "tenant", "currency"]),
            unpriced_tokens: spec("otel_llm_unpriced_tokens", &["model_name", "tenant", "token_type"]),
            slo_requests: spec("otel_llm_slo_requests", &["model_name", "engine_kind", "slo_status"]),
            slo_target: spec("otel_llm_slo_target", &["model_name"]),
        },
    });
    let engine = Engine::new(config).unwrap();
    ingest(&engine, &[engine_span(1, 1, 0.5)], 0.0);
    ingest(&engine, &[engine_span(2, 1, 2.0)], 0.0);
    engine.tick_at(2.0, 100.0);
    let text = engine.render(false);
    assert_eq!(lines_with(&text, "otel_llm_slo_requests_total{"), vec![
        "otel_llm_slo_requests_total{engine_kind=\"vllm\",model_name=\"m\",slo_status=\"met\"} 1.0",
        "otel_llm_slo_requests_total{engine_kind=\"vllm\",model_name=\"m\",slo_status=\"missed\"} 1.0"]);
    assert!(text.find("otel_llm_slo_requests_total").unwrap() < text.find("otel_llm_request_segment_seconds").unwrap());
    assert_eq!(engine.snapshot().accounting.len(), 1);
    // The accounting's series draw on the series' byte budget (one budget, as `recorder.budget`).
    let plain = self::engine(1);
    ingest(&plain, &[engine_span(1, 1, 0.5)], 0.0);
    ingest(&plain, &[engine_span(2, 1, 2.0)], 0.0);
    plain.tick_at(2.0, 100.0);
    let used = |text: &str| -> f64 {
        lines_with(text, "otel_llm_series_bytes{state=\"used\"}")[0].rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(used(&text) > used(&plain.render(false)), "{} {}", used(&text), used(&plain.render(false)));
}

#[test]
fn traces_completed_to_make_room_go_along_at_the_next_tick() {
    let mut config = config(1);
    config.assembly.max_traces = 2;
    let engine = Engine::new(config).unwrap();
    ingest(&engine, &[span(1, 1, "gateway"), span(2, 1, "gateway")], 0.0);
    let counts = ingest(&engine, &[span(3, 1, "gateway")], 0.0);
    assert_eq!((counts.completed_to_make_room, counts.late), (1, 0));
    // A span of the trace completed to make room, before its decision: it waits for it.
    let counts = ingest(&engine, &[span(1, 2, "db").parent(1)], 0.0);
    assert_eq!((counts.parked, engine.len()), (1, 2));
    let out = engine.tick_at(0.0, 100.0);
    assert_eq!((out.completed.clone(), out.late), (vec![(Reason::MemoryLimit, 1)], 1));
    assert_eq!(out.dropped_decisions, 1);
}

#[test]
fn a_graceful_restart_hands_over_pending_traces_and_decisions() {
    let first = engine(2);
    ingest(&first, &[engine_span(1, 1, 2.0)], 0.0);
    ingest(&first, &[span(2, 1, "gateway"), span(3, 1, "gateway")], 0.0);
    first.tick_at(2.0, 100.0); // trace 1 kept
    let mut overdue = Vec::new();
    first.overdue(0.0, |_| false, |trace| overdue.push(trace.trace_id));
    overdue.sort_unstable();
    assert_eq!(overdue, vec![[2; 16], [3; 16]]);
    let handed = first.take_pending(|trace| trace.trace_id == [2; 16]);
    assert_eq!((handed.len(), first.len()), (1, 1));
    first.complete_now(handed, Reason::Shutdown);
    first.drain();
    let out = first.tick_at(2.0, 100.0);
    assert_eq!(out.completed, vec![(Reason::Shutdown, 2)]);
    let decisions = first.decisions();
    assert_eq!(decisions.len(), 3);

    let second = engine(3);
    second.restore_decisions(decisions);
    assert!(second.remembered(&[1; 16]).unwrap().decision.keep);
    // The kept trace's engine span, redelivered: measured already, a duplicate.
    let counts = ingest(&second, &[engine_span(1, 1, 2.0)], 3.0);
    assert_eq!((counts.duplicate, counts.late), (1, 0));
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn valid_requests() -> Vec<Vec<u8>> {
        vec![
            request(&[engine_span(1, 1, 0.5), span(1, 2, "db").internal().parent(1)]),
            request(&[engine_span(2, 1, 2.0).failed().parent(3), span(2, 3, "gateway")]),
            request(&[span(4, 1, "InferRequest").attr("e2e", V::D(1.0)), span(5, 1, "llm_request")]),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        /// Hostile bytes (valid requests with bytes flipped, cut or appended, and noise) and odd
        /// clocks: refused or counted, never a panic; every completion goes along exactly once.
        #[test]
        fn hostile_requests_and_clocks_never_panic(
            edits in proptest::collection::vec((0usize..3, any::<usize>(), any::<u8>(), 0u8..3), 1..24),
            noise in proptest::collection::vec(any::<u8>(), 0..64),
            clocks in proptest::collection::vec(prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-1.0),
                                                            0.0..40.0f64], 1..6),
            shards in 1usize..4,
        ) {
            let engine = engine(shards);
            let requests = valid_requests();
            let mut completions = 0;
            let mut buffered = 0;
            for (step, (which, at, byte, how)) in edits.into_iter().enumerate() {
                let mut data = requests[which].clone();
                let at = at % data.len();
                match how {
                    0 => data[at] ^= byte | 1,
                    1 => data.truncate(at),
                    _ => data.insert(at, byte),
                }
                if let Ok(IngestSummary::Native(counts)) = engine.ingest(&data, false, clocks[step % clocks.len()]) {
                    buffered += counts.buffered - counts.duplicate - counts.dropped_over_trace_limit;
                }
            }
            let _ = engine.ingest(&noise, false, 0.0);
            for &now in &clocks {
                completions += engine.tick_at(now, now).completions();
            }
            engine.drain();
            completions += engine.tick_at(100.0, 100.0).completions();
            prop_assert_eq!(engine.len(), 0);
            prop_assert!(completions <= buffered, "{} completions of {} spans", completions, buffered);
            let _ = engine.render(true);
        }
    }
}

#[test]
fn spans_parked_for_a_declined_trace_wait_for_its_resumed_decision() {
    let mut config = config(1);
    config.assembly.max_traces = 1;
    let engine = Engine::new(config).unwrap();
    ingest(&engine, &[span(5, 1, "InferRequest").attr("e2e", V::D(1.0)).parent(9)], 0.0);
    let counts = ingest(&engine, &[span(6, 1, "gateway")], 0.0); // trace 5 completed to make room
    assert_eq!(counts.completed_to_make_room, 1);
    let counts = ingest(&engine, &[span(5, 2, "db").internal().parent(1)], 0.0);
    assert_eq!(counts.parked, 1);
    // The tick declines trace 5: its parked span is not handed on undecided (it would be dropped).
    let out = engine.tick_at(0.0, 100.0);
    assert_eq!((out.declined.len(), out.late), (1, 0));
    engine.resume(&[5; 16], KEEP_UNSAMPLED, &[[1; 8]]);
    let out = engine.tick_at(0.0, 100.0);
    assert_eq!((out.late, out.kept.len()), (1, 1));
    assert_eq!(out.kept[0].written.rows[0].span_id, "0202020202020202");
}

#[test]
fn the_rate_limit_turns_keeps_into_rate_limited_drops_but_not_the_errors() {
    let mut config = config(1);
    config.sampler.as_mut().unwrap().traces_per_second = 1.0;
    let engine = Engine::new(config).unwrap();
    for trace in 1..=5 {
        ingest(&engine, &[engine_span(trace, 1, 2.0)], 0.0);
    }
    ingest(&engine, &[engine_span(6, 1, 2.0).failed()], 0.0);
    let out = engine.tick_at(2.0, 100.0);
    assert_eq!(out.kept_decisions + out.rate_limited, 6);
    assert!(out.rate_limited >= 3, "{out:?}");
    assert!(out.kept.iter().any(|k| k.trace_id == [6; 16]));
    assert_eq!(out.kept.len() as u64, out.kept_decisions);
    assert_eq!(engine.counters().rate_limited, out.rate_limited);
}

// --- the hand-offs with Python (`handoff`) -------------------------------------------------------

use crate::handoff::{ObservationData, OriginData, SpanData, SpansData, SupplyError};
use crate::model::Value;

/// Several `SpansData` as one (their origins renumbered), in order.
fn merged(parts: Vec<SpansData>) -> SpansData {
    let mut out = SpansData::default();
    for part in parts {
        let base = out.origins.len();
        out.origins.extend(part.origins);
        out.spans.extend(part.spans.into_iter().map(|span| SpanData { origin: base + span.origin, ..span }));
    }
    out
}

/// What the engine reads of `spans` (one request), read back from a scratch engine: the spans it
/// buffered, as `spans_of` gives them, in the request's order (each trace's spans are consecutive
/// in these requests).
fn read_back(spans: &[S]) -> SpansData {
    let scratch = engine(1);
    ingest(&scratch, spans, 0.0);
    let traces = scratch.take_pending(|_| true);
    merged(traces.iter().map(|trace| scratch.spans_of(trace)).collect())
}

fn sorted(mut items: Vec<String>) -> Vec<String> {
    items.sort();
    items
}

fn supplied(engine: &Engine, data: &SpansData, now: f64) -> IngestCounts {
    engine.supply(data, now).unwrap_or_else(|e| panic!("refused: {e}"))
}

/// A span of trace 7 (`SpanData`), id `[id; 8]`, from origin `origin`.
fn span_data(id: u8, origin: usize, observation: Option<ObservationData>) -> SpanData {
    let mut payload = Vec::new();
    message(&mut payload, 0x0a, &[7; 16]);
    message(&mut payload, 0x12, &[id; 8]);
    message(&mut payload, 0x2a, b"llm_request");
    SpanData {
        trace_id: vec![7; 16], span_id: vec![id; 8], parent_span_id: Vec::new(), kind: SPAN_KIND_SERVER,
        status_code: 0, start_unix_ns: BASE, end_unix_ns: BASE + 1000 * MS, trace_state: String::new(), payload,
        origin, attrs_kept: true, observation,
    }
}

fn origin(service: &'static str) -> OriginData {
    let mut resource = Vec::new();
    message(&mut resource, 0x0a, &key_value("service.name", &V::S(service)));
    OriginData { resource, scope: b"\x0a\x01s".to_vec(), service_name: service.into() }
}

#[test]
fn a_supplied_request_is_buffered_as_if_the_engine_had_read_it() {
    let request = || vec![engine_span(1, 1, 2.0), span(1, 2, "db").internal().parent(1), engine_span(2, 1, 0.5),
                          span(5, 1, "InferRequest").attr("e2e", V::D(1.0)), span(3, 1, "llm_request"),
                          engine_span(4, 1, 0.25).failed()];
    for shards in [1, 3] {
        let (native, handed) = (engine(shards), engine(shards));
        let read = ingest(&native, &request(), 0.0);
        let data = read_back(&request());
        assert_eq!(data.spans.len(), 6);
        let supplied = supplied(&handed, &data, 0.0);
        // Python's `DigestCounts` counts what its digest refused; everything else as ingest counts it.
        assert_eq!(supplied, IngestCounts { malformed: Vec::new(), ..read.clone() });
        assert_eq!(read.malformed.len(), 1);
        assert_eq!((native.len(), native.held_spans()), (handed.len(), handed.held_spans()));
        // A late span of a supplied trace follows it as it follows a native one.
        let (a, b) = (native.tick_at(2.0, 100.0), handed.tick_at(2.0, 100.0));
        assert_eq!(ingest(&native, &[span(1, 3, "db").internal().parent(1)], 3.0),
                   ingest(&handed, &[span(1, 3, "db").internal().parent(1)], 3.0));
        let (a2, b2) = (native.tick_at(3.0, 100.0), handed.tick_at(3.0, 100.0));
        for (a, b) in [(&a, &b), (&a2, &b2)] {
            assert_eq!((a.completed.clone(), a.late, a.records_built, a.records_measured),
                       (b.completed.clone(), b.late, b.records_built, b.records_measured));
            assert_eq!((a.kept_decisions, a.dropped_decisions, a.malformed.clone()),
                       (b.kept_decisions, b.dropped_decisions, b.malformed.clone()));
            // With several shards, each engine's keyed hash orders its shards' completions its own way.
            let kept = |out: &TickOutput| sorted(out.kept.iter()
                .map(|k| format!("{:?} {:?} {:?}", k.trace_id, k.written.request, k.written.rows)).collect());
            assert_eq!(kept(a), kept(b));
            let declined = |engine: &Engine, out: &TickOutput| sorted(out.declined.iter()
                .map(|(c, reason)| format!("{:?} {reason:?}", engine.spans_of(&c.trace))).collect());
            assert_eq!(declined(&native, a), declined(&handed, b));
        }
        assert_eq!((a.kept.len(), a.declined.len(), a2.late), (2, 1, 1));
        if shards == 1 {
            assert_eq!(native.render(false), handed.render(false));
            assert_eq!(native.render(true), handed.render(true));
        } else {
            let lines = |text: String| sorted(text.lines().map(str::to_owned).collect());
            assert_eq!(lines(native.render(false)), lines(handed.render(false)));
        }
        let (mut x, y) = (native.counters(), handed.counters());
        assert_eq!((x.requests_native, x.requests_supplied, y.requests_native, y.requests_supplied), (2, 0, 1, 1));
        (x.requests_native, x.requests_supplied) = (y.requests_native, y.requests_supplied);
        assert_eq!(x, y);
    }
}

#[test]
fn a_supplied_observation_lands_in_its_fields_by_name() {
    let engine = engine(1);
    // Fields in no particular order: by name, never by position.
    let observation = ObservationData { adapter: "vllm_v1".into(), fields: vec![
        ("response_model".into(), Value::Text("m2".into())),
        ("itl_s".into(), Value::Floats(vec![0.01, 0.03])),
        ("e2e_s".into(), Value::Float(2.5)),
        ("prompt_tokens".into(), Value::Int(7)),
    ] };
    let data = SpansData { origins: vec![origin("a"), origin("b")],
                           spans: vec![span_data(1, 1, Some(observation)), span_data(2, 0, None)] };
    let counts = supplied(&engine, &data, 0.0);
    assert_eq!((counts.matched, counts.passed_through, counts.buffered), (vec![("vllm_v1".to_owned(), 1)], 1, 2));
    let taken = engine.take_pending(|_| true);
    let trace = &taken[0];
    let schema = engine.schema();
    let obs = trace.obs(0).unwrap();
    assert_eq!(obs.shape(), 0);
    assert_eq!(obs.float(schema.id("e2e_s").unwrap()), Some(2.5));
    assert_eq!(obs.int(schema.id("prompt_tokens").unwrap()), Some(7));
    assert_eq!(obs.text(schema.id("response_model").unwrap()), Some("m2"));
    assert_eq!(obs.floats(schema.id("itl_s").unwrap()).iter().collect::<Vec<_>>(), vec![0.01, 0.03]);
    assert_eq!(obs.float(schema.id("ttft_s").unwrap()), None);
    assert!(trace.obs(1).is_none());
    assert_eq!((trace.service_name(0), trace.service_name(1)), ("b", "a"));
    // Read back: the same spans, their origins, and the observation in the schema's field order.
    let back = engine.spans_of(trace);
    assert_eq!(back.origins, vec![origin("b"), origin("a")]);
    assert_eq!(back.spans.iter().map(|s| s.origin).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(back.spans[0].observation.as_ref().unwrap().fields.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
               vec!["e2e_s", "prompt_tokens", "response_model", "itl_s"]);
    assert_eq!(back.spans[1], span_data(2, 1, None));
    // And measured as such: model "m2", e2e 2.5, in origin b's service.
    engine.complete_now(taken, Reason::Ready);
    let out = engine.tick_at(0.0, 100.0);
    assert_eq!((out.records_measured, out.kept_decisions), (1, 1));
    assert_eq!(lines_with(&engine.render(false), "e2e_seconds_sum"), vec![
        "e2e_seconds_sum{engine_kind=\"vllm\",model_name=\"m2\",service_name=\"b\"} 2.5"]);
}

#[test]
fn a_supply_with_an_unknown_name_or_a_wrong_kind_is_refused_naming_it() {
    let engine = engine(1);
    let with = |adapter: &str, field: &str, value: Value| SpansData {
        origins: vec![origin("a")],
        spans: vec![span_data(1, 0, None),
                    span_data(2, 0, Some(ObservationData { adapter: adapter.into(), fields: vec![(field.into(), value)] }))],
    };
    let refused = |data: SpansData| engine.supply(&data, 0.0).unwrap_err();
    let err = refused(with("vllm_v1", "e2e", Value::Float(1.0)));
    assert_eq!(err, SupplyError::Field { span: 1, adapter: "vllm_v1".into(), field: "e2e".into() });
    assert_eq!(err.to_string(), "span 1 (vllm_v1): no observation field \"e2e\" is declared");
    let err = refused(with("vllm_v1", "e2e_s", Value::Int(1)));
    assert_eq!(err, SupplyError::Kind { span: 1, field: "e2e_s".into(), declared: Kind::Float, given: Kind::Int });
    assert!(err.to_string().contains("\"e2e_s\" is declared Float, given Int"), "{err}");
    let err = refused(with("vllm", "e2e_s", Value::Float(1.0)));
    assert_eq!(err.to_string(), "span 1: no shape has the adapter \"vllm\"");
    let mut data = with("vllm_v1", "e2e_s", Value::Float(1.0));
    data.spans[0].origin = 1;
    assert_eq!(refused(data), SupplyError::Origin { span: 0, origin: 1, origins: 1 });
    // Nothing of a refused supply is buffered (its first span was fine).
    assert_eq!((engine.len(), engine.counters().requests_supplied), (0, 0));
    // Ids the receivers refuse are counted, not buffered, as ingest counts them.
    let mut data = with("vllm_v1", "e2e_s", Value::Float(1.0));
    data.spans[0].span_id = vec![0; 8];
    data.spans[1].parent_span_id = vec![1; 3];
    let counts = supplied(&engine, &data, 0.0);
    assert_eq!((counts.invalid_ids, counts.buffered, engine.len()), (2, 0, 0));
}

#[test]
fn spans_of_a_declined_trace_gives_every_span_with_its_bytes_and_origin() {
    let engine = engine(1);
    let spans = [span(5, 1, "InferRequest").attr("e2e", V::D(1.0)).attr("model", V::S("t")),
                 span(5, 2, "db").internal().parent(1), span(5, 3, "compute").internal().parent(1).failed()];
    ingest(&engine, &spans, 0.0);
    let out = engine.tick_at(2.0, 100.0);
    assert_eq!(out.declined.len(), 1);
    let back = engine.spans_of(&out.declined[0].0.trace);
    let mut resource = Vec::new();
    message(&mut resource, 0x0a, &key_value("service.name", &V::S("svc")));
    assert_eq!(back.origins, vec![OriginData { resource, scope: Vec::new(), service_name: "svc".into() }]);
    assert_eq!(back.spans.len(), 3);
    for (got, sent) in back.spans.iter().zip(&spans) {
        assert_eq!(got.payload, sent.bytes(), "the span's bytes as received");
        assert_eq!((got.trace_id.as_slice(), got.span_id.as_slice()), (&[5; 16][..], &[sent.id; 8][..]));
        assert_eq!(got.parent_span_id, sent.parent.map_or_else(Vec::new, |p| vec![p; 8]));
        assert_eq!((got.kind, got.status_code, got.start_unix_ns, got.end_unix_ns),
                   (sent.kind, sent.status, BASE, BASE + 1000 * MS));
        assert_eq!((got.origin, got.trace_state.as_str()), (0, ""));
    }
    let root = back.spans[0].observation.as_ref().expect("the root's observation");
    assert_eq!(root.adapter, "triton_root");
    assert_eq!(root.fields, vec![("e2e_s".to_owned(), Value::Float(1.0)), ("response_model".to_owned(), Value::Text("t".into())),
                                 ("is_error".to_owned(), Value::Flag(false))]);
    assert!(back.spans[1].observation.is_none() && back.spans[2].observation.is_none());
    // Handed back, the trace is buffered as it was (and declined again, to Python).
    let again = Engine::new(config(1)).unwrap();
    supplied(&again, &back, 0.0);
    let out2 = again.tick_at(2.0, 100.0);
    assert_eq!(again.spans_of(&out2.declined[0].0.trace), back);
}

#[test]
fn a_supplied_span_s_attributes_are_read_only_where_python_kept_them() {
    let engine = engine(1);
    let with_route = |id: u8, attrs_kept: bool| {
        let mut span = span_data(id, 0, None);
        span.payload.extend(std::iter::once(0x4a).chain({
            let entry = key_value("http.route", &V::S("/v1"));
            let mut len = Vec::new();
            push_varint(&mut len, entry.len() as u64);
            len.into_iter().chain(entry)
        }));
        SpanData { attrs_kept, ..span }
    };
    let data = SpansData { origins: vec![origin("a")], spans: vec![with_route(1, true), with_route(2, false)] };
    supplied(&engine, &data, 0.0);
    let taken = engine.take_pending(|_| true);
    let trace = &taken[0];
    assert!(matches!(trace.attr(0, "http.route"), Some(crate::model::AnyValue::Str("/v1"))));
    assert!(trace.attr(1, "http.route").is_none());
    assert_eq!(engine.spans_of(trace), data);
}

#[test]
fn spans_of_a_kept_trace_the_writer_declined_gives_its_spans_for_python_s_writer() {
    let engine = engine(1);
    // A repeated key: ingest leaves the request to Python, which supplies the span as it read it
    // (here with its bytes as sent); kept (an error), the writer declines it to Python's.
    let sent = engine_span(9, 1, 0.5).failed().attr("model", V::S("m2"));
    let left = engine.ingest(&request(&[engine_span(9, 1, 0.5).failed().attr("model", V::S("m2"))]), false, 0.0);
    assert!(matches!(left, Ok(IngestSummary::Python)));
    let mut resource = Vec::new();
    message(&mut resource, 0x0a, &key_value("service.name", &V::S("svc")));
    let observation = ObservationData { adapter: "vllm_v1".into(), fields: vec![
        ("e2e_s".into(), Value::Float(0.5)), ("prompt_tokens".into(), Value::Int(10)),
        ("response_model".into(), Value::Text("m2".into())), ("is_error".into(), Value::Flag(true)),
    ] };
    let data = SpansData {
        origins: vec![OriginData { resource, scope: Vec::new(), service_name: "svc".into() }],
        spans: vec![SpanData { trace_id: vec![9; 16], span_id: vec![1; 8], parent_span_id: Vec::new(),
                               kind: SPAN_KIND_SERVER, status_code: STATUS_CODE_ERROR, start_unix_ns: BASE,
                               end_unix_ns: BASE + 1000 * MS, trace_state: String::new(), payload: sent.bytes(),
                               origin: 0, attrs_kept: true, observation: Some(observation) }],
    };
    supplied(&engine, &data, 0.0);
    let out = engine.tick_at(2.0, 100.0);
    assert_eq!((out.kept_decisions, out.kept.len(), out.kept_declined.len()), (1, 0, 1));
    let declined = &out.kept_declined[0];
    assert_eq!(declined.reason, crate::kept::Decline::RepeatedKey);
    assert_eq!(engine.name(declined.decision.policy), "errors");
    assert_eq!(engine.spans_of(&declined.trace), data);
    assert_eq!(lines_with(&engine.render(false), "e2e_seconds_count"), vec![
        "e2e_seconds_count{engine_kind=\"vllm\",model_name=\"m2\",service_name=\"svc\"} 1.0"]);
}
