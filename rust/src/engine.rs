//! `otel_llm._core.Engine`: the native engine (`otel_llm_engine::engine::Engine`, pure Rust) as one
//! Python object. The conversion happens here and only here: a request's bytes go in, and out come a
//! request's counts, a tick's output and the exposition, as plain Python values (tuples, lists, ints,
//! strs, bytes). Every call that does the engine's work, or waits on one of its locks, runs with the
//! GIL released (`py.allow_threads`): an ingest, a tick and a scrape run beside the Python threads
//! (the receivers, the admin server) and beside each other, as the engine's own locks allow. No lock
//! of the engine is ever held while the GIL is taken back (each closure returns owned Rust values
//! and the Python objects are made after it), so the GIL and the engine's locks never wait on each
//! other in a cycle.
//!
//! The configuration is one JSON document (`otel_llm.service.declarations.engine_declaration`),
//! compiled by `engine_config` below (see there for what it accepts until the declaration's parser
//! is merged).

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use otel_llm_engine::buffer::{AssemblySettings, Reason};
use otel_llm_engine::decide::{PolicyConfig, PolicyMetric, Rule, SamplerConfig};
use otel_llm_engine::engine::{Counters, Engine as Native, EngineConfig, IngestCounts, IngestSummary, TableConfig,
                              TickOutput};
use otel_llm_engine::ingest::IngestSettings;
use otel_llm_engine::kept::{Redaction, SpanRowOut, REDACTION_REASONS};
use otel_llm_engine::model::{Decision, Kind, Schema, ShapeInfo};
use otel_llm_engine::record::{RecordField as F, Side};
use otel_llm_engine::records::RecordSettings;
use otel_llm_engine::series::{CounterSpec, HistogramSpec, LabelSource, MetricsSpec, NamingSpec, Number, SegmentsSpec,
                              ValueSpec};
use otel_llm_engine::shapes::{Candidates, Read, RuleDef, ShapeDef};
use otel_llm_engine::wire::Malformed;

// --- the configuration ---------------------------------------------------------------------------

/// The engine's whole configuration from the declaration's JSON.
///
/// The lead's `otel_llm_engine::declaration::engine_config(json) -> Result<EngineConfig, String>`
/// (Python's declarations as JSON) is not merged into this branch yet; once it is, a document
/// without a `test_engine` key goes to it (one line below). Until then the only document accepted
/// is the test-only one, `{"test_engine": {...}}` (`test_engine_config`), and any other is refused
/// with a message saying so.
fn engine_config(json: &str) -> Result<EngineConfig, String> {
    let root: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("the engine's configuration is not JSON: {e}"))?;
    if let Some(test) = root.get("test_engine") {
        return test_engine_config(test);
    }
    Err("the engine's configuration: only {\"test_engine\": {...}} is read until \
         otel_llm_engine::declaration::engine_config is merged"
        .to_owned())
}

/// TEST ONLY: a small engine for the binding's own tests (`tests/unit/test_engine_binding.py`), the
/// engine crate's test configuration (`engine/tests.rs` `config`) with its shape made to read vLLM's
/// `llm_request` span as `tests/support/engine_fixtures.py` `vllm_request_span` builds it: a
/// `vllm:` naming (`vllm:e2e_request_latency_seconds`, `vllm:request_success_total`), a sampler
/// keeping failed requests and those slower than 1.5 s. Settings, each optional: `shards` (1),
/// `decision_wait_s` (10), `grace_s` (1), `max_traces` (1000), `write_kept` (true). Not a
/// configuration anyone serves with.
fn test_engine_config(json: &serde_json::Value) -> Result<EngineConfig, String> {
    let settings = json.as_object().ok_or("test_engine: an object expected")?;
    for key in settings.keys() {
        if !["shards", "decision_wait_s", "grace_s", "max_traces", "write_kept"].contains(&key.as_str()) {
            return Err(format!("test_engine: unknown setting {key:?}"));
        }
    }
    let count = |key: &str, default: usize| -> Result<usize, String> {
        settings.get(key).map_or(Ok(default), |v| {
            v.as_u64().map(|n| n as usize).ok_or_else(|| format!("test_engine.{key}: a count expected, got {v}"))
        })
    };
    let seconds = |key: &str, default: f64| -> Result<f64, String> {
        settings.get(key).map_or(Ok(default), |v| {
            v.as_f64().ok_or_else(|| format!("test_engine.{key}: a number of seconds expected, got {v}"))
        })
    };
    let write_kept = match settings.get("write_kept") {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| format!("test_engine.write_kept: true or false expected, got {v}"))?,
    };

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
    let schema = Schema::new(fields)?;
    let id = |name: &str| schema.id(name).ok_or_else(|| format!("test_engine: no field {name}"));
    let reads = vec![
        (vec![id("is_error")?, id("error_type")?], Read::Error),
        (vec![id("e2e_s")?], Read::Seconds(vec!["gen_ai.latency.e2e".into()])),
        (vec![id("prompt_tokens")?], Read::Count(vec!["gen_ai.usage.input_tokens".into()])),
        (vec![id("completion_tokens")?], Read::Count(vec!["gen_ai.usage.output_tokens".into()])),
        (vec![id("request_model")?], Read::Text(vec!["gen_ai.request.model".into()])),
    ];
    let shape = ShapeDef {
        info: ShapeInfo { adapter: "vllm_v1".into(), engine_kind: "vllm".into(), ..ShapeInfo::default() },
        reads,
        afterwards: Vec::new(),
        python_reading: false,
        reads_attributes: true,
    };
    let rules = vec![
        RuleDef { shape: Some(0), names: vec!["llm_request".into()], present: vec!["gen_ai.latency.e2e".into()],
                  ..RuleDef::default() },
        RuleDef { malformed: Some("missing_latency".into()), names: vec!["llm_request".into()], ..RuleDef::default() },
    ];
    let candidates = Candidates { names: vec!["llm_request".into()], ..Candidates::default() };
    let naming = NamingSpec {
        key: "vllm".into(),
        side: Side::Server,
        label_names: vec!["model_name".into(), "engine_kind".into(), "service_name".into()],
        labels: vec![LabelSource::Field(F::Model), LabelSource::Field(F::EngineKind),
                     LabelSource::Field(F::ServiceName)],
        histograms: vec![HistogramSpec {
            name: "vllm:e2e_request_latency".into(), unit: "s".into(), description: "Latency.".into(),
            buckets: vec![0.5, 1.0, 2.0],
            value: ValueSpec::Field(F::E2eS), success_only: false, fixed_label: None, per_step: None,
            buckets_by_model: Vec::new(),
        }],
        counters: vec![CounterSpec {
            name: "vllm:request_success".into(), unit: "{request}".into(), description: "Requests.".into(),
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
    Ok(EngineConfig {
        table: TableConfig { schema, shapes: vec![shape], rules, candidates },
        ingest: IngestSettings { max_attributes: 128, max_value_bytes: 1 << 20, max_latency_s: 86400.0,
                                 max_tokens: 10_000_000, abs_tolerance_s: 0.001, rel_tolerance: 0.01 },
        assembly: AssemblySettings {
            decision_wait_s: seconds("decision_wait_s", 10.0)?,
            grace_s: seconds("grace_s", 1.0)?,
            max_traces: count("max_traces", 1000)?,
            ..AssemblySettings::default()
        },
        records: RecordSettings::default(),
        carried: Vec::new(),
        sampler: Some(sampler),
        metrics,
        accounting: None,
        redaction: Redaction::default(),
        write_kept,
        shards: count("shards", 1)?,
        clock_start_s: 0.0,
    })
}

// --- what crosses the boundary -------------------------------------------------------------------

/// A decision as Python reads it: (keep, rate_limited, policy, threshold).
type DecisionOut = (bool, bool, String, String);

/// A kept trace, owned, ready to become Python values.
struct KeptOut {
    trace_id: [u8; 16],
    request: Vec<u8>,
    rows: Vec<SpanRowOut>,
    decision: DecisionOut,
}

/// A tick's output with the engine's name ids resolved (done without the GIL).
struct TickDone {
    out: TickOutput,
    kept: Vec<KeptOut>,
}

fn decision_out(engine: &Native, decision: &Decision) -> DecisionOut {
    (decision.keep, decision.rate_limited, engine.name(decision.policy), engine.name(decision.threshold))
}

fn row<'py>(py: Python<'py>, r: &SpanRowOut) -> PyResult<Bound<'py, PyTuple>> {
    // `span_rows.SpanRow`'s fields, in its order.
    (r.trace_id.as_str(), r.span_id.as_str(), r.parent_span_id.as_str(), r.name.as_str(), r.kind,
     r.service_name.as_str(), r.start_unix_ns, r.end_unix_ns, r.status_code, r.status_message.as_str(),
     r.attributes_json.as_str())
        .into_pyobject(py)
}

fn ingest_tuple<'py>(py: Python<'py>, c: &IngestCounts) -> PyResult<Bound<'py, PyTuple>> {
    let matched = PyList::empty(py);
    for (adapter, n) in &c.matched {
        matched.append((adapter.as_str(), *n))?;
    }
    let malformed = PyList::empty(py);
    for (reason, service, n) in &c.malformed {
        malformed.append((reason.as_str(), service.as_str(), *n))?;
    }
    (matched, malformed, c.passed_through, c.invalid_ids, c.buffered, c.duplicate, c.dropped_over_trace_limit,
     c.late, c.parked, c.completed_to_make_room)
        .into_pyobject(py)
}

fn tick_tuple<'py>(py: Python<'py>, done: TickDone) -> PyResult<Bound<'py, PyTuple>> {
    let TickDone { out, kept } = done;
    let kept_list = PyList::empty(py);
    for k in &kept {
        let rows = PyList::empty(py);
        for r in &k.rows {
            rows.append(row(py, r)?)?;
        }
        let (keep, rate_limited, policy, threshold) = &k.decision;
        kept_list.append((PyBytes::new(py, &k.trace_id), PyBytes::new(py, &k.request), rows,
                          (*keep, *rate_limited, policy.as_str(), threshold.as_str())))?;
    }
    let completed = PyList::empty(py);
    for (reason, n) in &out.completed {
        completed.append((reason.as_str(), *n))?;
    }
    // Declined completions: their trace ids and why, for now. Python handling them (building their
    // records, `decide`, `resume`, `record`, `add_measured`) comes later: until then the binding's
    // caller can only count them, and their parked late spans wait in the engine.
    let declined = PyList::empty(py);
    for (completion, reason) in &out.declined {
        declined.append((PyBytes::new(py, &completion.trace.trace_id), reason.as_str()))?;
    }
    let redacted = PyList::empty(py);
    for (reason, n) in REDACTION_REASONS.iter().zip(out.redacted.iter()) {
        redacted.append((*reason, *n))?;
    }
    let malformed = PyList::empty(py);
    for (reason, service) in &out.malformed {
        malformed.append((*reason, service.as_str()))?;
    }
    let items: Vec<PyObject> = vec![
        kept_list.into_any().unbind(),
        completed.into_any().unbind(),
        out.late.into_pyobject(py)?.into_any().unbind(),
        out.records_built.into_pyobject(py)?.into_any().unbind(),
        out.records_measured.into_pyobject(py)?.into_any().unbind(),
        out.kept_decisions.into_pyobject(py)?.into_any().unbind(),
        out.dropped_decisions.into_pyobject(py)?.into_any().unbind(),
        out.rate_limited.into_pyobject(py)?.into_any().unbind(),
        declined.into_any().unbind(),
        (out.kept_declined.len() as u64).into_pyobject(py)?.into_any().unbind(),
        redacted.into_any().unbind(),
        malformed.into_any().unbind(),
        out.decide_failed.into_pyobject(py)?.into_any().unbind(),
        out.spans_failed.into_pyobject(py)?.into_any().unbind(),
    ];
    PyTuple::new(py, items)
}

fn counters_dict<'py>(py: Python<'py>, c: &Counters) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for reason in Reason::ALL {
        if reason != Reason::Late {
            dict.set_item(format!("completed_{}", reason.as_str()), c.completed(reason))?;
        }
    }
    for (name, value) in [
        ("late", c.late), ("declined", c.declined), ("records_built", c.records_built),
        ("records_measured", c.records_measured), ("kept", c.kept), ("dropped", c.dropped),
        ("rate_limited", c.rate_limited), ("decide_failed", c.decide_failed), ("kept_written", c.kept_written),
        ("kept_declined", c.kept_declined), ("requests_native", c.requests_native),
        ("requests_python", c.requests_python),
    ] {
        dict.set_item(name, value)?;
    }
    Ok(dict)
}

// --- the class ----------------------------------------------------------------------------------

/// The native engine of one traces pipeline (see the module's doc).
#[pyclass(frozen, module = "otel_llm._core", name = "Engine")]
pub struct Engine {
    engine: Native,
}

#[pymethods]
impl Engine {
    /// `Engine(config_json)`: ValueError naming the setting refused.
    #[new]
    fn new(config_json: &str) -> PyResult<Self> {
        let config = engine_config(config_json).map_err(PyValueError::new_err)?;
        let engine = Native::new(config).map_err(PyValueError::new_err)?;
        Ok(Engine { engine })
    }

    /// `ingest(data, validated, now)`: one export request's bytes (any buffer: bytes, bytearray,
    /// memoryview). `None`: Python must read this request (nothing of it was buffered); else
    /// `(matched [(adapter, n)], malformed [(reason, service, n)], passed_through, invalid_ids,
    /// buffered, duplicate, dropped_over_trace_limit, late, parked, completed_to_make_room)`.
    /// ValueError for bytes that are no request (the engine serves the next one as before).
    fn ingest<'py>(&self, py: Python<'py>, data: &Bound<'py, PyAny>, validated: bool, now: f64)
                   -> PyResult<Option<Bound<'py, PyTuple>>> {
        let engine = &self.engine;
        let run = |bytes: &[u8]| py.allow_threads(|| engine.ingest(bytes, validated, now));
        // `bytes` is immutable: read in place, without a copy, while the GIL is released (the caller
        // holds the object). Any other buffer (bytearray, memoryview) may be written by another
        // thread while the GIL is released, and reading it then would be a data race, so its
        // contents are copied once (a memcpy, against a parse of every byte) with the GIL held.
        let summary = match data.downcast::<PyBytes>() {
            Ok(bytes) => run(bytes.as_bytes()),
            Err(_) => {
                let buffer = PyBuffer::<u8>::get(data)?;
                let copy = buffer.to_vec(py)?;
                buffer.release(py);
                run(&copy)
            }
        };
        match summary {
            Ok(IngestSummary::Python) => Ok(None),
            Ok(IngestSummary::Native(counts)) => Ok(Some(ingest_tuple(py, &counts)?)),
            Err(Malformed(reason)) => {
                Err(PyValueError::new_err(format!("malformed ExportTraceServiceRequest: {reason}")))
            }
        }
    }

    /// `tick(now)`: `(kept [(trace_id, request bytes, rows, (keep, rate_limited, policy,
    /// threshold))], completed [(reason, n)], late, records_built, records_measured, kept_decisions,
    /// dropped_decisions, rate_limited, declined [(trace_id, reason)], kept_declined,
    /// redacted [(reason, n)], malformed [(reason, service)], decide_failed, spans_failed)`; a row is
    /// `span_rows.SpanRow`'s fields as a tuple.
    fn tick<'py>(&self, py: Python<'py>, now: f64) -> PyResult<Bound<'py, PyTuple>> {
        let engine = &self.engine;
        let done = py.allow_threads(|| {
            let mut out = engine.tick(now);
            let kept = std::mem::take(&mut out.kept)
                .into_iter()
                .map(|k| KeptOut {
                    trace_id: k.trace_id,
                    request: k.written.request,
                    rows: k.written.rows,
                    decision: decision_out(engine, &k.decision),
                })
                .collect();
            TickDone { out, kept }
        });
        tick_tuple(py, done)
    }

    /// The exposition (text 0.0.4, or OpenMetrics without `# EOF`).
    #[pyo3(signature = (openmetrics=false))]
    fn render(&self, py: Python<'_>, openmetrics: bool) -> String {
        let engine = &self.engine;
        py.allow_threads(|| engine.render(openmetrics))
    }

    /// The engine's counters since it started, by name.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let engine = &self.engine;
        let counters = py.allow_threads(|| engine.counters());
        counters_dict(py, &counters)
    }

    /// Pending traces.
    fn __len__(&self, py: Python<'_>) -> usize {
        let engine = &self.engine;
        py.allow_threads(|| engine.len())
    }

    /// Pending traces (as `len()`).
    fn len(&self, py: Python<'_>) -> usize {
        self.__len__(py)
    }

    /// Spans of the pending traces.
    fn held_spans(&self, py: Python<'_>) -> usize {
        let engine = &self.engine;
        py.allow_threads(|| engine.held_spans())
    }

    /// Heap bytes of the trace buffer.
    fn heap_bytes(&self, py: Python<'_>) -> usize {
        let engine = &self.engine;
        py.allow_threads(|| engine.heap_bytes())
    }

    /// Buffer shards.
    fn shards(&self) -> usize {
        self.engine.shards()
    }

    /// Each shard's oldest `fraction` of traces completed now (they go along at the next tick).
    fn shed(&self, py: Python<'_>, fraction: f64) -> PyResult<usize> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(PyValueError::new_err(format!("shed: fraction must be within [0, 1], got {fraction}")));
        }
        let engine = &self.engine;
        Ok(py.allow_threads(|| engine.shed(fraction)))
    }

    /// Every pending trace completed (they go along at the next tick).
    fn drain(&self, py: Python<'_>) -> usize {
        let engine = &self.engine;
        py.allow_threads(|| engine.drain())
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Engine>()
}
