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
//! The configuration is one JSON document, `otel_llm.service.declarations.engine_declaration`'s,
//! compiled by `otel_llm_engine::declaration::engine_config` (its errors name the section and
//! setting refused, and become ValueErrors here).

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use otel_llm_engine::buffer::Reason;
use otel_llm_engine::declaration::engine_config;
use otel_llm_engine::engine::{Counters, Engine as Native, IngestCounts, IngestSummary, TickOutput};
use otel_llm_engine::handoff::{ObservationData, OriginData, SpanData, SpansData};
use otel_llm_engine::kept::{SpanRowOut, REDACTION_REASONS};
use otel_llm_engine::model::{Decision, Kind, Schema, Value};
use otel_llm_engine::wire::Malformed;

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
    /// Each declined completion's spans, read back for Python (`Engine::spans_of`), in its order.
    declined_spans: Vec<SpansData>,
}

/// A field's value as Python holds it.
fn value_to_py(py: Python<'_>, value: &Value) -> PyResult<PyObject> {
    Ok(match value {
        Value::Float(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Int(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Text(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Flag(v) => v.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Floats(v) => PyList::new(py, v)?.into_any().unbind(),
        Value::Texts(v) => PyList::new(py, v)?.into_any().unbind(),
    })
}

/// A field's value from Python, of the kind the schema declares for `name` (an unknown field, or a
/// value of another type, is a ValueError naming the field).
fn value_from_py(schema: &Schema, name: &str, value: &Bound<'_, PyAny>) -> PyResult<Value> {
    let Some(id) = schema.id(name) else {
        return Err(PyValueError::new_err(format!("observation field {name}: not in the engine's schema")));
    };
    let wrong = |e: PyErr| PyValueError::new_err(format!("observation field {name}: {e}"));
    Ok(match schema.kind(id) {
        Kind::Float => Value::Float(value.extract().map_err(wrong)?),
        Kind::Int => Value::Int(value.extract().map_err(wrong)?),
        Kind::Text => Value::Text(value.extract().map_err(wrong)?),
        Kind::Flag => Value::Flag(value.extract().map_err(wrong)?),
        Kind::Floats => Value::Floats(value.extract().map_err(wrong)?),
        Kind::Texts => Value::Texts(value.extract().map_err(wrong)?),
    })
}

type OriginIn = (Vec<u8>, Vec<u8>, String);
type ObservationIn<'py> = Option<(String, Vec<(String, Bound<'py, PyAny>)>)>;
type SpanIn<'py> = (Vec<u8>, Vec<u8>, Vec<u8>, i32, i32, u64, u64, String, Vec<u8>, usize, bool, ObservationIn<'py>);

/// `SpansData` as Python tuples: `(origins [(resource, scope, service_name)], spans [(trace_id,
/// span_id, parent_span_id, kind, status_code, start_unix_ns, end_unix_ns, trace_state, payload,
/// origin, attrs_kept, observation (adapter, [(field, value)]) or None)])`, as `supply` takes them.
fn spans_to_py<'py>(py: Python<'py>, data: &SpansData) -> PyResult<Bound<'py, PyTuple>> {
    let origins = PyList::empty(py);
    for o in &data.origins {
        origins.append((PyBytes::new(py, &o.resource), PyBytes::new(py, &o.scope), o.service_name.as_str()))?;
    }
    let spans = PyList::empty(py);
    for s in &data.spans {
        let observation: PyObject = match &s.observation {
            None => py.None(),
            Some(obs) => {
                let fields = PyList::empty(py);
                for (name, value) in &obs.fields {
                    fields.append((name.as_str(), value_to_py(py, value)?))?;
                }
                (obs.adapter.as_str(), fields).into_pyobject(py)?.into_any().unbind()
            }
        };
        let ids = (PyBytes::new(py, &s.trace_id), PyBytes::new(py, &s.span_id), PyBytes::new(py, &s.parent_span_id));
        let row = PyTuple::new(py, [
            ids.0.into_any(), ids.1.into_any(), ids.2.into_any(),
            s.kind.into_pyobject(py)?.into_any(), s.status_code.into_pyobject(py)?.into_any(),
            s.start_unix_ns.into_pyobject(py)?.into_any(), s.end_unix_ns.into_pyobject(py)?.into_any(),
            s.trace_state.as_str().into_pyobject(py)?.into_any(), PyBytes::new(py, &s.payload).into_any(),
            s.origin.into_pyobject(py)?.into_any(), s.attrs_kept.into_pyobject(py)?.to_owned().into_any(),
            observation.into_bound(py),
        ])?;
        spans.append(row)?;
    }
    (origins, spans).into_pyobject(py)
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
    let TickDone { out, kept, declined_spans } = done;
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
    // Declined completions: their trace ids, why, and their spans read back (`spans_of`), so Python
    // can rebuild them. Python handling them (building their records, `decide`, `resume`, `record`,
    // `add_measured`) comes with the switch of the pipeline; until then their parked late spans wait.
    let declined = PyList::empty(py);
    for ((completion, reason), spans) in out.declined.iter().zip(&declined_spans) {
        declined.append((PyBytes::new(py, &completion.trace.trace_id), reason.as_str(), spans_to_py(py, spans)?))?;
    }
    let redacted = PyList::empty(py);
    for (reason, n) in REDACTION_REASONS.iter().zip(out.redacted.iter()) {
        redacted.append((*reason, *n))?;
    }
    let malformed = PyList::empty(py);
    for (reason, service) in &out.malformed {
        malformed.append((*reason, service.as_str()))?;
    }
    // `count_measured`'s self-telemetry: ((engine kind, outcome), n), (reason, n), ((service, what), n).
    let pairs = |counts: &[((String, String), u64)]| -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for ((a, b), n) in counts {
            list.append(((a.as_str(), b.as_str()), *n))?;
        }
        Ok(list)
    };
    let assembled = pairs(&out.assembled)?;
    let unmeasured = pairs(&out.unmeasured)?;
    let values_rejected = PyList::empty(py);
    for (reason, n) in &out.values_rejected {
        values_rejected.append((reason.as_str(), *n))?;
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
        assembled.into_any().unbind(),
        values_rejected.into_any().unbind(),
        unmeasured.into_any().unbind(),
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
        ("requests_python", c.requests_python), ("requests_supplied", c.requests_supplied),
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
    /// `Engine(config_json)` (`json.dumps(engine_declaration(...))`): ValueError naming the setting
    /// refused.
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
        // A `bytes` object is read in place while the GIL is released: its contents never change and
        // the caller holds it for the call. Any other buffer (bytearray, memoryview, array) may be
        // written by another thread while the GIL is released, and reading it then would be a data
        // race, so its contents are copied once (a memcpy, against a parse of every byte) with the GIL
        // held. (No `unsafe`: the receivers hand the pipeline `bytes`, so the copy is the rare case.)
        let summary = match data.downcast::<PyBytes>() {
            Ok(bytes) => run(bytes.as_bytes()),
            Err(_) => {
                let buffer = PyBuffer::<u8>::get(data)?;
                let copy = buffer.to_vec(py)?;
                let summary = run(&copy);
                buffer.release(py);
                summary
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
    /// dropped_decisions, rate_limited, declined [(trace_id, reason, spans)], kept_declined,
    /// redacted [(reason, n)], malformed [(reason, service)], decide_failed, spans_failed,
    /// assembled [((engine_kind, outcome), n)], values_rejected [(reason, n)],
    /// unmeasured [((service, what), n)])`; a row is `span_rows.SpanRow`'s fields as a tuple.
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
            let declined_spans = out.declined.iter().map(|(completion, _)| engine.spans_of(&completion.trace)).collect();
            TickDone { out, kept, declined_spans }
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

    /// `supply(origins, spans, now)`: the spans of a request Python read (`ingest` returned None),
    /// as `otel_llm.service.handoff.supplied` makes them from the reference digest's `BufferedSpan`s,
    /// buffered as if the engine had read them; returns `ingest`'s counts. ValueError naming the span
    /// and field for what the engine cannot take (an unknown adapter or field, a value of another
    /// kind, an origin out of range): nothing of the request is buffered then.
    fn supply<'py>(&self, py: Python<'py>, origins: Vec<OriginIn>, spans: Vec<SpanIn<'py>>, now: f64)
                   -> PyResult<Bound<'py, PyTuple>> {
        let schema = self.engine.schema();
        let mut data = SpansData {
            origins: origins.into_iter()
                .map(|(resource, scope, service_name)| OriginData { resource, scope, service_name })
                .collect(),
            spans: Vec::with_capacity(spans.len()),
        };
        for (trace_id, span_id, parent_span_id, kind, status_code, start_unix_ns, end_unix_ns, trace_state, payload,
             origin, attrs_kept, observation) in spans {
            let observation = match observation {
                None => None,
                Some((adapter, fields)) => Some(ObservationData {
                    adapter,
                    fields: fields.iter().map(|(name, value)| Ok((name.clone(), value_from_py(schema, name, value)?)))
                        .collect::<PyResult<_>>()?,
                }),
            };
            data.spans.push(SpanData { trace_id, span_id, parent_span_id, kind, status_code, start_unix_ns, end_unix_ns,
                                       trace_state, payload, origin, attrs_kept, observation });
        }
        let engine = &self.engine;
        let counts = py.allow_threads(|| engine.supply(&data, now))
            .map_err(|e| PyValueError::new_err(format!("supply refused: {e}")))?;
        ingest_tuple(py, &counts)
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
