//! `processor/llm_metrics/requests.py`'s `records_of_trace` for the shapes most traffic has (its
//! `_simple_request`: one engine span alone, or directly under the trace's only GenAI span, a
//! gateway's SERVER span), read from the spans and observations this core made: the same record,
//! field for field, by the same rules and IEEE operations. An SGLang request is read from its stage
//! spans as `composite.sglang` reads it (its unified layout; a prefill/decode pair is Python's).
//! Whatever those rules leave to more Python (another composite engine's spans, a malformed
//! upstream sampling threshold, timings
//! Python refuses, an attribute value that is not a string or a number, a span or observation of
//! the Python classes) it declines (`None`), and Python reads the trace as
//! before: the Python functions stay the reference (`tests/unit/llm_metrics/test_records_fast_path.py`
//! compares both on every shape, setting and random trace).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use std::collections::HashMap;

use crate::buffer::SpanSet;
use crate::record::{NativeSegments, RequestRecord, FIELDS, FIELD_COUNT};
use crate::{ns, observation_timings_native, segment_name, tuple_new, value_of_key, Observation, Row, OBSERVATION_FLOATS};

const SPAN_KIND_SERVER: i32 = 2;
pub(crate) const STATUS_CODE_ERROR: i32 = 2;

/// A value the Python rules read differently from a string, a number or nothing: declined.
pub(crate) struct Declined;

pub(crate) type Read<T> = Result<T, Declined>;

/// `requests._text`: the first value of `key` among a span's kept attributes: `Ok(None)` when
/// there is none (or it is `None`), the string when it is one; anything else (a list, a map, a
/// bool, a number, which `_text` turns into text by rules of its own) is declined.
fn text<'py>(py: Python<'py>, row: &Row, key: &str) -> Read<Option<Bound<'py, PyString>>> {
    match attribute(py, row, key)? {
        None => Ok(None),
        Some(value) if value.is_none() => Ok(None),
        Some(value) => value.downcast_exact::<PyString>().map(|s| Some(s.clone())).map_err(|_| Declined),
    }
}

/// The object after the first `key` in a span's `(key, value, ...)` attributes; `Some(None)`-like
/// (`Some` of Python's `None`) for a key in last place, as `BufferedSpan.attr` reads it.
fn attribute<'py>(py: Python<'py>, row: &Row, key: &str) -> Read<Option<Bound<'py, PyAny>>> {
    let attrs = row.attrs.bind(py).downcast::<PyTuple>().map_err(|_| Declined)?;
    let length = attrs.len();
    let mut index = 0;
    while index < length {
        let item = attrs.get_item(index).map_err(|_| Declined)?;
        let Ok(name) = item.downcast_exact::<PyString>() else { return Err(Declined) };
        if name.to_str().map_err(|_| Declined)? == key {
            return Ok(Some(if index + 1 < length {
                attrs.get_item(index + 1).map_err(|_| Declined)?
            } else {
                py.None().into_bound(py)
            }));
        }
        index += 2;
    }
    Ok(None)
}

fn has_attributes(py: Python<'_>, row: &Row) -> Read<bool> {
    row.attrs.bind(py).is_truthy().map_err(|_| Declined)
}

/// `requests._route`: `_text(span, "http.route") or _text(span, "url.path")`.
fn route<'py>(py: Python<'py>, row: &Row) -> Read<Option<Bound<'py, PyString>>> {
    match text(py, row, "http.route")? {
        Some(found) if !found.to_str().map_err(|_| Declined)?.is_empty() => Ok(Some(found)),
        _ => text(py, row, "url.path"),
    }
}

/// A string field of an observation as `x or ""` reads it: `None` for `None` or "".
fn present<'py>(py: Python<'py>, value: &PyObject) -> Read<Option<Bound<'py, PyAny>>> {
    let value = value.bind(py);
    Ok(if value.is_truthy().map_err(|_| Declined)? { Some(value.clone()) } else { None })
}

fn as_str<'a>(value: &'a Bound<'_, PyAny>) -> Read<std::borrow::Cow<'a, str>> {
    value.downcast::<PyString>().map_err(|_| Declined)?.to_cow().map_err(|_| Declined)
}

fn int_of(obs: &Observation, index: usize) -> Option<i64> {
    (obs.present & (1 << (OBSERVATION_FLOATS + index)) != 0).then(|| obs.ints[index])
}

/// A rare field (`None` or its default when the observation holds none).
fn rare<'py>(py: Python<'py>, obs: &Observation, index: usize) -> Read<Option<Bound<'py, PyAny>>> {
    match &obs.rare {
        None => Ok(None),
        Some(rare) => Ok(Some(rare.bind(py).get_item(index).map_err(|_| Declined)?)),
    }
}

/// An int field held as an object (`None`, or an int that fits 64 bits; anything else declined).
fn object_int(value: Option<&Bound<'_, PyAny>>) -> Read<Option<i64>> {
    match value {
        None => Ok(None),
        Some(value) if value.is_none() => Ok(None),
        Some(value) if value.is_exact_instance_of::<PyInt>() => value.extract::<i64>().map(Some).map_err(|_| Declined),
        Some(_) => Err(Declined),
    }
}

fn is_true(py: Python<'_>, flag: &PyObject) -> Read<bool> {
    flag.bind(py).is_truthy().map_err(|_| Declined)
}

/// The compiled core's span and its observation (either may be another class: declined).
fn native<'a, 'py>(span: &'a Bound<'py, PyAny>) -> Read<&'a Bound<'py, Row>> {
    span.downcast::<Row>().map_err(|_| Declined)
}

fn observation_of<'py>(py: Python<'py>, row: &Row) -> Read<Option<Bound<'py, Observation>>> {
    let observation = row.observation.bind(py);
    if observation.is_none() {
        return Ok(None);
    }
    observation.downcast::<Observation>().map(|o| Some(o.clone())).map_err(|_| Declined)
}

/// The strings a record is made of that come from `requests.py`'s constants (handed over once, so
/// a label's string is the object Python's own records use: the recorder's caches key on identity).
struct Constants {
    error: PyObject,
    length: PyObject,
    unknown: PyObject,
    server: PyObject,
    default_source: PyObject,
    genai_kind: String,
    other_error: PyObject,
}

/// Builds a trace's request record where the trace has one of the common shapes; `None` otherwise.
#[pyclass(frozen, module = "otel_llm._core")]
pub struct RecordBuilder {
    segment_type: PyObject,
    edge_ttft_attributes: Vec<String>,
    first_token_event: String,
    max_latency_s: f64,
    default_operation: PyObject,
    genai_operations: Vec<String>,
    route_operations: Vec<(String, PyObject)>,
    finish_reasons: Vec<(String, PyObject)>,
    composite_kinds: Vec<String>,
    /// `RecordSettings.resource_model_rules`: (attribute, its source word, the mapping or `None`).
    resource_model_rules: Vec<(Py<PyString>, Py<PyString>, Option<Py<PyDict>>)>,
    model_from_service_name: bool,
    default_model: Py<PyString>,
    /// `requests.MAX_ADJUSTED_COUNT`: the heaviest weight an upstream threshold may give.
    max_adjusted_count: f64,
    constants: Constants,
    /// `composite.sglang`'s constants, where SGLang's requests are read here too.
    sglang: Option<SglangRules>,
}

/// What `composite.sglang` reads an SGLang request's stage spans by, handed over by Python
/// (`requests.native_record_builder`): the engine kind and part names, the abort outcome and its
/// error type, the stage lists, two segment names, `MAX_PARTS`, and whether this interpreter's
/// `sum()` of floats is compensated (CPython 3.12 and later) or plain.
struct SglangRules {
    kind: String,
    stage_part: String,
    abort: PyObject,
    aborted: PyObject,
    preprocess_stages: Vec<String>,
    kv_stages: Vec<String>,
    queue_and_prefill: Py<PyString>,
    kv_transfer: Py<PyString>,
    max_parts: usize,
    compensated_sum: bool,
    /// The observation the adapters share among the spans of each stage, and the stage it names.
    stage_observations: Vec<(PyObject, String)>,
}

/// `SglangRules`' fields in order, as Python passes them.
type SglangArgs = (String, String, PyObject, PyObject, Vec<String>, Vec<String>, Py<PyString>, Py<PyString>, usize, bool,
                   Vec<PyObject>);

/// What `composite.sglang` changes in the record `build_record` made from the root's observation.
struct Composite<'py> {
    queue: Option<f64>,
    prefill: Option<f64>,
    decode: Option<f64>,
    inference: Option<f64>,
    tpot: Option<f64>,
    segments: Bound<'py, PyTuple>,
    missing: Bound<'py, PyTuple>,
    /// A span below the root closed with status ERROR: an unknown outcome becomes an abort.
    error_below: bool,
}

/// Python's `sum()` of floats as this interpreter adds them: left to right, or (3.12 and later)
/// with Neumaier's compensation (`Python/bltinmodule.c` `builtin_sum_impl`). The first term
/// starts the sum as `0 + x` does (exact for the non-negative durations summed here).
fn python_sum(values: &[f64], compensated: bool) -> f64 {
    let mut total = values[0];
    let mut compensation = 0.0;
    for &value in &values[1..] {
        let sum = total + value;
        if compensated {
            if total.abs() >= value.abs() {
                compensation += (total - sum) + value;
            } else {
                compensation += (value - sum) + total;
            }
        }
        total = sum;
    }
    if compensated && compensation != 0.0 && compensation.is_finite() {
        total += compensation;
    }
    total
}

/// A time as Python's int, one of 64 bits where it fits.
fn wide<'py>(py: Python<'py>, value: i128) -> PyResult<Bound<'py, PyAny>> {
    Ok(match i64::try_from(value) {
        Ok(small) => small.into_pyobject(py)?.into_any(),
        Err(_) => value.into_pyobject(py)?.into_any(),
    })
}

/// `composite._seconds`: a part's duration, declined where Python raises `MalformedSpan`.
fn part_seconds(row: &Row) -> Read<f64> {
    if row.start_unix_ns == 0 || row.end_unix_ns < row.start_unix_ns {
        return Err(Declined);
    }
    Ok((row.end_unix_ns - row.start_unix_ns) as f64 / 1e9)
}

/// A stage's spans (at least one, by start): their durations summed as Python sums them, and the
/// stage's segment from the first one's start to the last one's end.
fn stage_interval(rows: &[Bound<'_, Row>], stage: &[usize], compensated: bool) -> Read<(f64, i128, i128)> {
    let mut seconds = Vec::with_capacity(stage.len());
    for &index in stage {
        seconds.push(part_seconds(rows[index].get())?);
    }
    let (first, last) = (rows[stage[0]].get(), rows[stage[stage.len() - 1]].get());
    Ok((python_sum(&seconds, compensated), first.start_unix_ns as i128, last.end_unix_ns as i128))
}

/// `start + composite._ns(seconds)`, declined where the core's integers do not hold it.
fn offset(start: u64, seconds: f64) -> Read<i128> {
    ns(seconds).map(|n| start as i128 + n as i128).ok_or(Declined)
}

impl RecordBuilder {
    /// A request's outcome from a finish reason, as `_FINISH_REASONS.get(reason.lower(), UNKNOWN)` (a
    /// reason that is not ASCII, whose lowercase Python and Rust might spell differently, is declined).
    fn finish_outcome(&self, py: Python<'_>, reason: &Bound<'_, PyAny>) -> Read<PyObject> {
        let reason = as_str(reason)?;
        if !reason.is_ascii() {
            return Err(Declined);
        }
        let lower = reason.to_ascii_lowercase();
        Ok(self.finish_reasons.iter().find(|(name, _)| *name == lower)
            .map_or_else(|| self.constants.unknown.clone_ref(py), |(_, outcome)| outcome.clone_ref(py)))
    }

    /// `requests._outcome`.
    fn outcome(&self, py: Python<'_>, obs: &Observation) -> Read<PyObject> {
        if is_true(py, &obs.is_error)? {
            return Ok(self.constants.error.clone_ref(py));
        }
        if let Some(reason) = present(py, &obs.finish_reason)? {
            return self.finish_outcome(py, &reason);
        }
        if let (Some(max), Some(completion)) = (int_of(obs, 2), int_of(obs, 1)) {
            if max != 0 && completion >= max {
                return Ok(self.constants.length.clone_ref(py));
            }
        }
        Ok(self.constants.unknown.clone_ref(py))
    }

    fn is_genai_operation(&self, name: &Bound<'_, PyAny>) -> Read<bool> {
        let name = as_str(name)?;
        Ok(self.genai_operations.iter().any(|op| *op == name))
    }

    /// `requests._resolve_model` and, where it names no model, `_fallback_model` (the engine's
    /// service name, what the gateway named, the configured default): (model, model source, request
    /// model, response model). An engine's own span and resource come before its gateway's (`genai`:
    /// an app's span, whose gateway comes first).
    fn model<'py>(&self, py: Python<'py>, own: &Row, obs: &Observation, gateway: Option<(&Row, &Observation)>,
                  genai: bool) -> PyResult<Read<Model<'py>>> {
        let seen = match observed_model(py, obs, gateway) {
            Ok(seen) => seen,
            Err(declined) => return Ok(Err(declined)),
        };
        let empty = || PyString::new(py, "").into_any();
        let response = seen.response.clone().unwrap_or_else(empty);
        if let Some((model, source)) = seen.own {
            let request = seen.request.unwrap_or_else(|| model.clone());
            return Ok(Ok((model, source, request, response)));
        }
        // What was asked for, whichever rule names the label: `request or heard` in Python.
        let asked = seen.request.clone().or_else(|| seen.heard.as_ref().map(|(model, _)| model.clone()));
        if genai {
            if let Some((model, source)) = seen.heard {
                return Ok(Ok((model, source, asked.unwrap_or_else(empty), response)));
            }
        }
        let resource = own.origin.bind(py).getattr(pyo3::intern!(py, "resource_strings"))?;
        let Ok(resource) = resource.downcast_exact::<PyDict>() else { return Ok(Err(Declined)) };
        for (attribute, source, values) in &self.resource_model_rules {
            let Some(raw) = resource.get_item(attribute.bind(py))? else { continue };
            if raw.is_none() {
                continue;
            }
            let model = match values {
                None => raw,
                Some(values) => match values.bind(py).get_item(raw)? {
                    Some(mapped) => mapped,
                    None => continue,
                },
            };
            if !model.is_truthy()? {
                break; // Python returns it, and `build_record` then takes `_fallback_model`'s
            }
            let request = asked.unwrap_or_else(|| model.clone());
            return Ok(Ok((model, source.bind(py).clone().into_any(), request, response)));
        }
        let request = asked.unwrap_or_else(empty);
        if self.model_from_service_name && !genai {
            if let Some(service) = resource.get_item(pyo3::intern!(py, "service.name"))? {
                let Ok(name) = service.downcast_exact::<PyString>() else { return Ok(Err(Declined)) };
                let text = name.to_cow()?;
                if !text.is_empty() && !text.starts_with("unknown_service") {
                    return Ok(Ok((service.clone(), pyo3::intern!(py, "resource:service.name").clone().into_any(),
                                   request, response)));
                }
            }
        }
        if let Some((model, source)) = seen.heard {
            return Ok(Ok((model, source, request, response)));
        }
        if !self.default_model.bind(py).to_cow()?.is_empty() {
            return Ok(Ok((self.default_model.bind(py).clone().into_any(),
                          self.constants.default_source.bind(py).clone(), request, response)));
        }
        Ok(Ok((empty(), pyo3::intern!(py, "none").clone().into_any(), request, response)))
    }

    fn route_operation(&self, py: Python<'_>, row: &Row) -> Read<Option<PyObject>> {
        if !has_attributes(py, row)? {
            return Ok(None);
        }
        let Some(found) = route(py, row)? else { return Ok(None) };
        let found = found.to_str().map_err(|_| Declined)?;
        Ok(self.route_operations.iter().find(|(path, _)| path == found).map(|(_, op)| op.clone_ref(py)))
    }

    /// `requests._operation` over the engine span and its lookup (the gateway, if any).
    fn operation(&self, py: Python<'_>, obs: &Observation, own: &Row, gateway: Option<(&Row, &Observation)>)
                 -> Read<(PyObject, PyObject)> {
        let span = pyo3::intern!(py, "span").clone().into_any().unbind();
        let mut custom: Option<(PyObject, PyObject)> = None;
        if let Some(name) = present(py, &obs.operation_name)? {
            if self.is_genai_operation(&name)? {
                return Ok((name.unbind(), span));
            }
            custom = Some((name.unbind(), span));
        }
        if let Some(operation) = self.route_operation(py, own)? {
            return Ok((operation, pyo3::intern!(py, "route").clone().into_any().unbind()));
        }
        if let Some((row, observed)) = gateway {
            if let Some(name) = present(py, &observed.operation_name)? {
                // The shape's gateway is a SERVER span: requests.py words its side "gateway".
                let side = pyo3::intern!(py, "gateway").clone().into_any().unbind();
                if self.is_genai_operation(&name)? {
                    return Ok((name.unbind(), side));
                }
                custom = custom.or(Some((name.unbind(), side)));
            }
            if let Some(operation) = self.route_operation(py, row)? {
                return Ok((operation, pyo3::intern!(py, "route").clone().into_any().unbind()));
            }
        }
        Ok(custom.unwrap_or_else(|| (self.default_operation.clone_ref(py), self.constants.default_source.clone_ref(py))))
    }

    /// `requests._span_seconds`.
    fn span_seconds(&self, row: &Row, rejected: &mut Vec<&'static str>) -> Option<f64> {
        let (start, end) = (row.start_unix_ns, row.end_unix_ns);
        if start == 0 || end < start {
            rejected.push("invalid_span_times");
            return None;
        }
        let seconds = (end - start) as f64 / 1e9;
        if seconds <= self.max_latency_s {
            return Some(seconds);
        }
        rejected.push("absurd_span_duration");
        None
    }

    /// `requests._valid_seconds` with the edge TTFT's reason.
    fn valid_edge_ttft(&self, value: f64, rejected: &mut Vec<&'static str>) -> Option<f64> {
        if value.is_finite() && 0.0 <= value && value <= self.max_latency_s {
            return Some(value);
        }
        rejected.push("invalid_edge_ttft");
        None
    }

    /// `requests._edge_ttft`: the configured attributes, then the first-token event's time.
    fn edge_ttft(&self, py: Python<'_>, edge: &Row, rejected: &mut Vec<&'static str>) -> Read<Option<f64>> {
        if !has_attributes(py, edge)? {
            return Ok(None);
        }
        for key in &self.edge_ttft_attributes {
            let Some(value) = attribute(py, edge, key)? else { continue };
            // `_number`: None and bools read as nothing; a float or an int as a float; a string
            // float() may or may not take is left to Python.
            if value.is_none() || value.is_exact_instance_of::<PyBool>() {
                continue;
            }
            let number = if let Ok(float) = value.downcast_exact::<PyFloat>() {
                float.value()
            } else if value.is_exact_instance_of::<PyInt>() {
                value.extract::<i64>().map_err(|_| Declined)? as f64
            } else {
                return Err(Declined);
            };
            return Ok(self.valid_edge_ttft(number, rejected));
        }
        let Some(event) = attribute(py, edge, &self.first_token_event)? else { return Ok(None) };
        if event.is_none() || edge.start_unix_ns == 0 {
            return Ok(None);
        }
        if !event.is_exact_instance_of::<PyInt>() {
            return Err(Declined);
        }
        let event = crate::recorder::wide_int(&event).map_err(|_| Declined)?;
        let offset = event - edge.start_unix_ns as i128;
        Ok(self.valid_edge_ttft(offset as f64 / 1e9, rejected))
    }
}

type Model<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// What `requests._resolve_model` reads from the request's spans: the model its own span names and
/// the one its gateway names (`heard`), each with its source, and the request and response models
/// either says.
struct SeenModels<'py> {
    own: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    heard: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    request: Option<Bound<'py, PyAny>>,
    response: Option<Bound<'py, PyAny>>,
}

fn observed_model<'py>(py: Python<'py>, obs: &Observation, gateway: Option<(&Row, &Observation)>)
                       -> Read<SeenModels<'py>> {
    let mut response = present(py, &obs.response_model)?;
    let mut request = present(py, &obs.request_model)?;
    let own = match (&response, &request) {
        (Some(response), _) => Some((response.clone(), pyo3::intern!(py, "span:gen_ai.response.model").clone().into_any())),
        (None, Some(request)) => Some((request.clone(), pyo3::intern!(py, "span:gen_ai.request.model").clone().into_any())),
        _ => None,
    };
    let mut heard = None;
    if let Some((_, observed)) = gateway {
        if response.is_none() || request.is_none() {
            let span_response = present(py, &observed.response_model)?;
            let span_request = present(py, &observed.request_model)?;
            if own.is_none() {
                // The shape's gateway is a SERVER span: requests.py words its side "gateway".
                heard = match (&span_response, &span_request) {
                    (Some(model), _) => Some((model.clone(), pyo3::intern!(py, "gateway:gen_ai.response.model").clone().into_any())),
                    (None, Some(model)) => Some((model.clone(), pyo3::intern!(py, "gateway:gen_ai.request.model").clone().into_any())),
                    _ => None,
                };
            }
            response = response.or(span_response);
            request = request.or(span_request);
        }
    }
    Ok(SeenModels { own, heard, request, response })
}

/// `requests.adjusted_count`: 1 / the sampling probability of an OTel `ot=th:` threshold, 1.0 without
/// one. Declined where Python raises (a threshold that is not 1-14 hex digits, an absurd count),
/// where its `strip()` could read whitespace Rust's would not (anything but printable ASCII), and
/// where the denominator is not exact in a double (Python divides the integers exactly).
fn adjusted_count(trace_state: &str, max_adjusted_count: f64) -> Read<f64> {
    if !trace_state.contains("th:") {
        return Ok(1.0);
    }
    if !trace_state.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(Declined);
    }
    for member in trace_state.split(',') {
        let member = member.trim_matches(' ');
        let (key, value) = member.split_once('=').unwrap_or((member, ""));
        if key != "ot" {
            continue;
        }
        for field in value.split(';') {
            let (name, threshold) = field.split_once(':').unwrap_or((field, ""));
            if name != "th" {
                continue;
            }
            if threshold.is_empty() || threshold.len() > 14 || !threshold.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Declined);
            }
            let rejected = u64::from_str_radix(&format!("{threshold:0<14}"), 16).map_err(|_| Declined)?;
            let denominator = (1u64 << 56) - rejected;
            if denominator as f64 as u64 != denominator {
                return Err(Declined);
            }
            let count = (1u64 << 56) as f64 / denominator as f64;
            if count > max_adjusted_count {
                return Err(Declined);
            }
            return Ok(count);
        }
    }
    Ok(1.0)
}

/// `requests._simple_request`: (the engine span, the gateway above it if any), or declined.
/// A span with its observation, both the core's.
type Observed<'py> = (Bound<'py, Row>, Bound<'py, Observation>);

/// `shared_parts`: observations the adapters share among part spans (the Python class's, each a part).
fn simple_shape<'py>(py: Python<'py>, spans: &SpanSet<'_, 'py>, shared_parts: &[(PyObject, String)])
                     -> Read<(Observed<'py>, Option<Observed<'py>>)> {
    let mut engine: Option<Observed<'py>> = None;
    let mut gateway: Option<Observed<'py>> = None;
    for span in spans.values() {
        let row = native(&span)?;
        let observation = match observation_of(py, row.get()) {
            Ok(Some(observation)) => observation,
            Ok(None) => continue,
            // Not the core's class: a stage span's shared observation is a part, anything else Python's.
            Err(declined) => {
                let held = row.get().observation.bind(py);
                if shared_parts.iter().any(|(shared, _)| shared.bind(py).is(held)) {
                    continue;
                }
                return Err(declined);
            }
        };
        let observed = observation.get();
        if is_true(py, &observed.part)? {
            continue;
        }
        if is_true(py, &observed.may_be_gateway)? {
            if gateway.is_some() {
                return Err(Declined);
            }
            gateway = Some((row.clone(), observation));
        } else if engine.is_none() {
            engine = Some((row.clone(), observation));
        } else {
            return Err(Declined);
        }
    }
    let Some(engine) = engine else { return Err(Declined) };
    let own = engine.0.get();
    match &gateway {
        None => {
            if own.has_parent && (spans.len() > 1 || own.parent_span_id[..] == *own.span_id.bind(py).as_bytes()) {
                return Err(Declined);
            }
        }
        Some((gateway, _)) => {
            let edge = gateway.get();
            if edge.kind != SPAN_KIND_SERVER || !own.has_parent
                || own.parent_span_id[..] != *edge.span_id.bind(py).as_bytes() {
                return Err(Declined);
            }
            // A span above the gateway, or a cycle: the general joining reads it.
            if edge.has_parent && spans.contains_id(&edge.parent_span_id).map_err(|_| Declined)? {
                return Err(Declined);
            }
        }
    }
    Ok((engine, gateway))
}

#[pymethods]
impl RecordBuilder {
    /// `record_fields`: `RequestRecord`'s fields, which must be the core's record's (`record.rs`);
    /// `segment_type`: `Segment`; the settings `RecordSettings` holds that these shapes read; the tables
    /// and strings of `requests.py` (`_FINISH_REASONS`, `_ROUTE_OPERATIONS`, `GENAI_OPERATIONS`,
    /// `_COMPOSITE_KINDS`, the outcomes) as it holds them; `sglang`: `composite.sglang`'s constants
    /// (`SglangRules`), or `None` to leave SGLang's requests to Python.
    #[new]
    #[pyo3(signature = (record_fields, segment_type, edge_ttft_attributes, first_token_event, max_latency_s,
                        default_operation, genai_operations, route_operations, finish_reasons, composite_kinds,
                        resource_model_rules, model_from_service_name, default_model, max_adjusted_count, outcomes,
                        server_side, default_source, genai_kind, other_error, sglang))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, record_fields: Vec<String>, segment_type: PyObject, edge_ttft_attributes: Vec<String>,
           first_token_event: String, max_latency_s: f64, default_operation: PyObject, genai_operations: Vec<String>,
           route_operations: Vec<(String, PyObject)>, finish_reasons: Vec<(String, PyObject)>,
           composite_kinds: Vec<String>, resource_model_rules: Vec<(Py<PyString>, Option<Py<PyDict>>)>,
           model_from_service_name: bool, default_model: Py<PyString>, max_adjusted_count: f64,
           outcomes: (PyObject, PyObject, PyObject),
           server_side: PyObject, default_source: PyObject, genai_kind: String, other_error: PyObject,
           sglang: Option<SglangArgs>) -> PyResult<Self> {
        if record_fields != FIELDS {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "RequestRecord's fields are {record_fields:?}; the core builds {FIELDS:?}")));
        }
        let (error, length, unknown) = outcomes;
        let sglang = match sglang {
            None => None,
            Some((kind, stage_part, abort, aborted, preprocess_stages, kv_stages, queue_and_prefill, kv_transfer,
                  max_parts, compensated_sum, shared)) => {
                // Each shared observation's stage, read once by Python's own `part` and `mark`.
                let mut stage_observations = Vec::with_capacity(shared.len());
                for observation in shared {
                    let bound = observation.bind(py);
                    let part: String = bound.getattr("part")?.extract()?;
                    let name: String = bound.call_method1("mark", ("stage",))?.extract()?;
                    if part != stage_part {
                        return Err(pyo3::exceptions::PyValueError::new_err(format!(
                            "the observation of SGLang stage {name:?} is not a {stage_part:?} part")));
                    }
                    stage_observations.push((observation, name));
                }
                Some(SglangRules {
                    kind, stage_part, abort, aborted, preprocess_stages, kv_stages, queue_and_prefill, kv_transfer,
                    max_parts, compensated_sum, stage_observations,
                })
            }
        };
        let resource_model_rules = resource_model_rules.into_iter().map(|(attribute, values)| {
            let source = PyString::new(py, &format!("resource:{}", attribute.bind(py))).unbind();
            (attribute, source, values.filter(|v| !v.bind(py).is_empty()))
        }).collect();
        Ok(RecordBuilder {
            segment_type, edge_ttft_attributes, first_token_event, max_latency_s, default_operation,
            genai_operations, route_operations, finish_reasons, composite_kinds, resource_model_rules,
            model_from_service_name, default_model, max_adjusted_count,
            constants: Constants { error, length, unknown, server: server_side, default_source, genai_kind, other_error },
            sglang,
        })
    }

    /// The trace's one request record (a `RequestRecord`), or `None` where Python reads the trace.
    fn build(&self, py: Python<'_>, spans: Bound<'_, PyDict>) -> PyResult<Option<PyObject>> {
        match self.read(py, &SpanSet::Dict(spans)) {
            Ok(Ok(record)) => Ok(Some(record)),
            Ok(Err(Declined)) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `build` of each trace's spans, in order, in one call (a completion batch's): the record,
    /// `None`, or in its place the exception building it raised, so one trace's failure is its own.
    fn build_many(&self, py: Python<'_>, traces: Vec<Bound<'_, PyDict>>) -> PyResult<Py<PyList>> {
        let mut built: Vec<PyObject> = Vec::with_capacity(traces.len());
        for spans in traces {
            built.push(match self.read(py, &SpanSet::Dict(spans)) {
                Ok(Ok(record)) => record,
                Ok(Err(Declined)) => py.None(),
                Err(error) => error.into_value(py).into_any(),
            });
        }
        Ok(PyList::new(py, built)?.unbind())
    }
}

impl RecordBuilder {
    pub(crate) fn read<'py>(&self, py: Python<'py>, spans: &SpanSet<'_, 'py>) -> PyResult<Read<PyObject>> {
        let shared_parts = self.sglang.as_ref().map_or(&[][..], |rules| &rules.stage_observations[..]);
        let (engine, gateway) = match simple_shape(py, spans, shared_parts) {
            Ok(shape) => shape,
            Err(declined) => return Ok(Err(declined)),
        };
        let (own, obs) = (engine.0.get(), engine.1.get());
        let lookup = gateway.as_ref().map(|(row, observed)| (row.get(), observed.get()));
        let kind = obs.engine_kind.bind(py);
        let Ok(kind_text) = as_str(kind) else { return Ok(Err(Declined)) };
        let sglang = match &self.sglang {
            Some(rules) if rules.kind == kind_text => Some(rules),
            _ => None,
        };
        if sglang.is_none() && self.composite_kinds.iter().any(|k| *k == kind_text) {
            return Ok(Err(Declined)); // its other spans are read by composite.py
        }
        let weight = match adjusted_count(&own.trace_state.bind(py).to_cow()?, self.max_adjusted_count) {
            Ok(weight) => weight,
            Err(declined) => return Ok(Err(declined)),
        };
        let genai = kind_text == self.constants.genai_kind;
        let start = own.start_unix_ns.into_pyobject(py)?.into_any();
        let Some((timings, segments)) =
            observation_timings_native(py, obs, &start, true)? else { return Ok(Err(Declined)) };
        let composite = match sglang {
            None => None,
            Some(rules) => match self.sglang(py, rules, spans, own, obs, &timings)? {
                Ok(parts) => Some(parts),
                Err(declined) => return Ok(Err(declined)),
            },
        };
        Ok(self.assemble(py, own, obs, lookup, &kind.clone(), genai, weight, start, timings, segments, composite)?)
    }

    /// `composite.sglang` on the request of `root` (its stage spans below it in `spans`), from the
    /// timings `build_record` read from the root's observation: what it changes in the record.
    fn sglang<'py>(&self, py: Python<'py>, rules: &SglangRules, spans: &SpanSet<'_, 'py>, root: &Row,
                   obs: &Observation, timings: &Bound<'py, PyTuple>) -> PyResult<Read<Composite<'py>>> {
        macro_rules! read {
            ($e:expr) => {
                match $e {
                    Ok(value) => value,
                    Err(Declined) => return Ok(Err(Declined)),
                }
            };
        }
        if spans.len() > rules.max_parts {
            return Ok(Err(Declined)); // `descendants` would stop at MAX_PARTS: Python's cut
        }
        // `composite.descendants`: breadth first, each span's children in the trace's order.
        let mut rows: Vec<Bound<'py, Row>> = Vec::with_capacity(spans.len());
        let mut children: HashMap<[u8; 8], Vec<usize>> = HashMap::new();
        for span in spans.values() {
            let row = read!(native(&span)).clone();
            let held = row.get();
            if held.has_parent {
                children.entry(held.parent_span_id).or_default().push(rows.len());
            }
            rows.push(row);
        }
        let id_of = |row: &Row| -> Option<[u8; 8]> { row.span_id.bind(py).as_bytes().try_into().ok() };
        let mut below: Vec<usize> = Vec::new();
        let mut seen: Vec<bool> = vec![false; rows.len()];
        let root_id = id_of(root);
        let mut frontier: Vec<Option<[u8; 8]>> = vec![root_id];
        while !frontier.is_empty() {
            let mut following = Vec::new();
            for id in frontier {
                let Some(found) = id.and_then(|id| children.get(&id)) else { continue };
                for &index in found {
                    let child = rows[index].get();
                    if seen[index] || child.span_id.bind(py).as_bytes() == root.span_id.bind(py).as_bytes() {
                        continue; // Python's `seen` starts with the root's id
                    }
                    seen[index] = true;
                    below.push(index);
                    following.push(id_of(child));
                }
            }
            frontier = following;
        }
        let error_below = below.iter().any(|&index| rows[index].get().status_code == STATUS_CODE_ERROR);
        // The stage spans by stage name, each list by start (a stable sort, as Python's).
        let mut stages: Vec<(String, Vec<usize>)> = Vec::new();
        let stage_key = pyo3::intern!(py, "stage");
        for &index in &below {
            let observation = rows[index].get().observation.bind(py);
            if observation.is_none() {
                continue;
            }
            let name = if let Some((_, name)) = rules.stage_observations.iter()
                .find(|(shared, _)| shared.bind(py).is(observation)) {
                name.clone() // the adapters' one observation per stage (`engines.sglang_stage_observation`)
            } else {
                let Some(observation) = read!(observation_of(py, rows[index].get())) else { continue };
                let observed = observation.get();
                let part = observed.part.bind(py);
                if part.is_none() || read!(as_str(part)) != rules.stage_part.as_str() {
                    continue;
                }
                let name = match &observed.rare {
                    Some(rare) => value_of_key(py, rare.bind(py).get_item(8)?.downcast::<PyTuple>()?, stage_key)?,
                    None => py.None().into_bound(py),
                };
                if name.is_none() {
                    continue; // `str(None)`: a stage no rule reads
                }
                read!(as_str(&name)).into_owned()
            };
            match stages.iter_mut().find(|(known, _)| *known == name) {
                Some((_, same)) => same.push(index),
                None => stages.push((name, vec![index])),
            }
        }
        for (_, same) in stages.iter_mut() {
            same.sort_by_key(|&index| rows[index].get().start_unix_ns);
        }
        let stage = |name: &str| stages.iter().find(|(known, _)| known == name).map(|(_, same)| same.as_slice());
        let span = |index: usize| rows[index].get();
        let float_at = |index: usize| -> PyResult<Option<f64>> {
            let value = timings.get_item(index)?;
            Ok(if value.is_none() { None } else { Some(value.extract::<f64>()?) })
        };
        let (ttft, e2e, given_decode) = (float_at(0)?, float_at(1)?, float_at(4)?);
        let start = root.start_unix_ns;
        let end: i128 = match e2e {
            Some(e2e) => read!(offset(start, e2e)),
            None => root.end_unix_ns as i128,
        };
        let mut segments: Vec<(&'static str, Option<Bound<'py, PyString>>, i128, i128)> = Vec::new();
        let mut missing: Vec<&'static str> = Vec::new();
        let (queue, prefill);
        match (stage("prefill_waiting"), stage("prefill_forward")) {
            (Some(waiting), Some(forward)) => {
                let pre: Vec<usize> = rules.preprocess_stages.iter()
                    .flat_map(|name| stage(name).unwrap_or(&[]).iter().copied()).collect();
                if !pre.is_empty() {
                    let pre_end = pre.iter().map(|&i| span(i).end_unix_ns).max().unwrap_or(0);
                    let pre_start = pre.iter().map(|&i| span(i).start_unix_ns).min().unwrap_or(0).min(start);
                    if pre_end > pre_start {
                        segments.push(("preprocess", None, pre_start as i128, pre_end as i128));
                    }
                }
                let (waited, first, last) = read!(stage_interval(&rows, waiting, rules.compensated_sum));
                queue = Some(waited);
                segments.push(("queue", None, first, last));
                let (forwarded, first, last) = read!(stage_interval(&rows, forward, rules.compensated_sum));
                prefill = Some(forwarded);
                segments.push(("prefill", None, first, last));
            }
            _ => {
                (queue, prefill) = (None, None);
                missing.extend(["queue", "prefill"]);
                let dispatch_to_first = match &obs.rare {
                    Some(rare) => value_of_key(py, rare.bind(py).get_item(8)?.downcast::<PyTuple>()?,
                                               pyo3::intern!(py, "dispatch_to_first_token_s"))?,
                    None => py.None().into_bound(py),
                };
                if let (Some(ttft), Ok(dispatch)) = (ttft, dispatch_to_first.downcast::<PyFloat>()) {
                    let dispatch = dispatch.value();
                    if 0.0 <= dispatch && dispatch <= ttft {
                        let handoff = read!(offset(start, ttft - dispatch));
                        if handoff > start as i128 {
                            segments.push(("preprocess", None, start as i128, handoff));
                        }
                        segments.push(("", Some(rules.queue_and_prefill.bind(py).clone()), handoff,
                                       read!(offset(start, ttft))));
                    }
                }
            }
        }
        let mut decode = given_decode;
        match stage("decode_forward").or_else(|| stage("decode_loop")) {
            Some(decoding) => {
                let (decoded, first, last) = read!(stage_interval(&rows, decoding, rules.compensated_sum));
                decode = Some(decoded);
                segments.push(("decode", None, first, last));
            }
            None => match (given_decode, ttft) {
                (Some(given), Some(ttft)) => {
                    let first = read!(offset(start, ttft));
                    let Some(length) = ns(given) else { return Ok(Err(Declined)) };
                    segments.push(("decode", None, first, first + length as i128));
                }
                _ => {
                    decode = None;
                    missing.push("decode");
                }
            },
        }
        for name in &rules.kv_stages {
            if let Some(moving) = stage(name) {
                segments.push(("", Some(rules.kv_transfer.bind(py).clone()), span(moving[0]).start_unix_ns as i128,
                               span(moving[moving.len() - 1]).end_unix_ns as i128));
                break;
            }
        }
        let inference = match (prefill, decode) {
            (Some(prefill), Some(decode)) => Some(prefill + decode),
            _ => None,
        };
        // `composite._tpot`.
        let tpot = match (decode, int_of(obs, 1)) {
            (Some(decode), Some(tokens)) if tokens > 1 => Some(decode / (tokens - 1) as f64),
            _ => None,
        };
        segments.sort_by_key(|segment| segment.2);
        // `composite._tail`: what follows the last segment to the request's end.
        if let Some(last) = segments.iter().map(|segment| segment.3).max() {
            if end > last {
                segments.push(("postprocess", None, last, end));
            }
        }
        let tuple_new = tuple_new(py)?;
        let segment_type = self.segment_type.bind(py);
        let mut built = Vec::with_capacity(segments.len());
        for (name, named, first, last) in segments {
            let name = named.unwrap_or_else(|| segment_name(py, name));
            built.push(tuple_new.call1((segment_type, (name, wide(py, first)?, wide(py, last)?)))?);
        }
        Ok(Ok(Composite {
            queue, prefill, decode, inference, tpot,
            segments: PyTuple::new(py, built)?,
            missing: PyTuple::new(py, missing.into_iter().map(|name| segment_name(py, name)))?,
            error_below,
        }))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble<'py>(&self, py: Python<'py>, own: &Row, obs: &Observation, lookup: Option<(&Row, &Observation)>,
                     kind: &Bound<'py, PyAny>, genai: bool, weight: f64, start: Bound<'py, PyAny>,
                     timings: Bound<'py, PyTuple>, segments: Vec<(&'static str, i64, i64)>,
                     composite: Option<Composite<'py>>) -> PyResult<Read<PyObject>> {
        macro_rules! read {
            ($e:expr) => {
                match $e {
                    Ok(value) => value,
                    Err(Declined) => return Ok(Err(Declined)),
                }
            };
        }
        let (model, source, request_model, response_model) = read!(self.model(py, own, obs, lookup, genai)?);
        let (operation, operation_source) = read!(self.operation(py, obs, own, lookup));
        let mut outcome = read!(self.outcome(py, obs));
        let mut error_type = read!(read!(rare(py, obs, 1)).map_or(Ok(None), |e| present(py, &e.unbind())));
        if let (Some(parts), Some(rules)) = (&composite, &self.sglang) {
            // `composite.sglang`: aborted in the queue, the root has no finish reason.
            if parts.error_below && outcome.bind(py).eq(self.constants.unknown.bind(py))? {
                outcome = rules.abort.clone_ref(py);
                error_type = error_type.or_else(|| Some(rules.aborted.bind(py).clone()));
            }
        }
        let mut rejected_dynamic: Option<Bound<'py, PyAny>> = None;
        let mut rejected: Vec<&'static str> = Vec::new();
        // `_read_cache_and_spec` (the server side looks at the gateway too).
        let mut cached = int_of(obs, 3);
        let mut written = read!(object_int(read!(rare(py, obs, 2)).as_ref()));
        let mut spec = read!(rare(py, obs, 3)).filter(|s| !s.is_none());
        if let Some(reason) = read!(rare(py, obs, 4)) {
            if reason.is_truthy()? {
                rejected_dynamic = Some(reason);
            }
        }
        if let Some((_, seen)) = lookup {
            if cached.is_none() || written.is_none() || spec.is_none() {
                cached = cached.or(int_of(seen, 3));
                written = match written {
                    Some(value) => Some(value),
                    None => read!(object_int(read!(rare(py, seen, 2)).as_ref())),
                };
                spec = spec.or(read!(rare(py, seen, 3)).filter(|s| !s.is_none()));
            }
        }
        let prompt = int_of(obs, 0);
        if let Some(count) = cached {
            if count < 0 || prompt.is_some_and(|p| count > p) {
                rejected.push("cached_tokens_exceed_prompt");
                cached = None;
            }
        }
        if let Some(count) = written {
            if count < 0 || prompt.is_some_and(|p| count > p) {
                rejected.push("cache_write_tokens_exceed_prompt");
                written = None;
            }
        }
        let spec_values = match &spec {
            None => None,
            Some(spec) => {
                let Ok(spec) = spec.downcast_exact::<PyTuple>() else { return Ok(Err(Declined)) };
                if spec.len() != 3 {
                    return Ok(Err(Declined));
                }
                Some(spec.clone())
            }
        };
        // The span's own duration where the engine gave no e2e (`build_record`).
        let mut e2e_object = timings.get_item(1)?;
        let mut e2e = if e2e_object.is_none() { None } else { Some(e2e_object.extract::<f64>()?) };
        if e2e.is_none() {
            e2e = self.span_seconds(own, &mut rejected);
            if let Some(seconds) = e2e {
                e2e_object = PyFloat::new(py, seconds).into_any();
            }
        }
        // `_join_server_side`.
        if outcome.bind(py).eq(self.constants.unknown.bind(py))? && read!(present(py, &obs.finish_reason)).is_none() {
            if let Some((_, seen)) = lookup {
                if let Some(reason) = read!(present(py, &seen.finish_reason)) {
                    outcome = read!(self.finish_outcome(py, &reason));
                }
            }
        }
        let mut gateway_overhead: Option<f64> = None;
        let mut edge_ttft: Option<f64> = None;
        let mut edge_span_id = PyBytes::new(py, b"").into_any();
        if let Some((edge, _)) = lookup {
            if edge.status_code == STATUS_CODE_ERROR && !outcome.bind(py).eq(self.constants.error.bind(py))? {
                outcome = self.constants.error.clone_ref(py);
                error_type = Some(match read!(text(py, edge, "error.type")) {
                    Some(found) if !found.to_str()?.is_empty() => found.into_any(),
                    _ => self.constants.other_error.bind(py).clone(),
                });
            }
            let measured_by_engine = !genai && e2e.is_some();
            edge_span_id = edge.span_id.bind(py).clone().into_any();
            let edge_duration = self.span_seconds(edge, &mut rejected);
            if let (true, Some(duration), Some(e2e)) = (measured_by_engine, edge_duration, e2e) {
                let overhead = duration - e2e;
                if overhead >= 0.0 {
                    gateway_overhead = Some(overhead);
                } else {
                    rejected.push("negative_gateway_overhead");
                }
            }
            edge_ttft = read!(self.edge_ttft(py, edge, &mut rejected));
        }
        let none = || py.None().into_bound(py);
        let number = |value: Option<f64>| value.map_or_else(none, |v| PyFloat::new(py, v).into_any());
        let int = |value: Option<i64>| -> PyResult<Bound<'py, PyAny>> {
            Ok(match value {
                Some(v) => v.into_pyobject(py)?.into_any(),
                None => none(),
            })
        };
        let or_empty = |value: Option<Bound<'py, PyAny>>| value.unwrap_or_else(|| PyString::new(py, "").into_any());
        let origin = own.origin.bind(py);
        let empty_tuple = PyTuple::empty(py).into_any();
        let rare_or_empty = |index: usize| -> PyResult<Bound<'py, PyAny>> {
            Ok(match &obs.rare {
                Some(rare) => rare.bind(py).get_item(index)?,
                None => PyTuple::empty(py).into_any(),
            })
        };
        let mut all_rejected: Vec<Bound<'py, PyAny>> = Vec::with_capacity(rejected.len() + 1);
        // `_read_cache_and_spec` notes the observation's own reason first.
        if let Some(reason) = rejected_dynamic {
            all_rejected.push(reason);
        }
        for reason in rejected {
            all_rejected.push(PyString::intern(py, reason).into_any());
        }
        let (mut queue, mut prefill, mut decode) = (timings.get_item(2)?, timings.get_item(3)?, timings.get_item(4)?);
        let (mut inference, mut tpot) = (timings.get_item(5)?, timings.get_item(8)?);
        // The composite's segments are named tuples already; the observation's stay numbers.
        let (mut composite_segments, mut missing) = (None, empty_tuple.clone());
        if let Some(parts) = composite {
            (queue, prefill, decode) = (number(parts.queue), number(parts.prefill), number(parts.decode));
            (inference, tpot) = (number(parts.inference), number(parts.tpot));
            (composite_segments, missing) = (Some(parts.segments), parts.missing.into_any());
        }
        let native_segments = composite_segments.is_none();
        let segments_field = match composite_segments {
            Some(tuple) => tuple.into_any(),
            None => none(),  // not read: the record's `segments` are `native_segments`
        };
        let fields = [
            PyBytes::new(py, &own.trace_id).into_any(), own.span_id.bind(py).clone().into_any(), kind.clone(),
            obs.adapter.bind(py).clone(), origin.getattr(pyo3::intern!(py, "service_name"))?, model, source,
            request_model, response_model, operation.into_bound(py), or_empty(read!(present(py, &obs.provider_name))),
            outcome.into_bound(py), self.constants.server.bind(py).clone(), operation_source.into_bound(py),
            or_empty(error_type), or_empty(read!(present(py, &obs.server_address))),
            or_empty(read!(present(py, &obs.server_port))), start,
            timings.get_item(0)?, tpot, e2e_object, queue, prefill, decode, inference, int(prompt)?,
            int(int_of(obs, 1))?, number(gateway_overhead), none(), number(edge_ttft), edge_span_id,
            PyBytes::new(py, b"").into_any(), segments_field, empty_tuple.clone(), PyFloat::new(py, weight).into_any(),
            PyTuple::new(py, all_rejected)?.into_any(), missing, timings.get_item(9)?, rare_or_empty(9)?,
            int(cached)?, int(written)?, match read!(rare(py, obs, 5)) { Some(v) => v, None => none() },
            rare_or_empty(7)?, PyString::new(py, "").into_any(),
        ];
        let (accepted, drafted, steps) = match spec_values {
            Some(spec) => (spec.get_item(0)?, spec.get_item(1)?, spec.get_item(2)?),
            None => (none(), none(), none()),
        };
        let empty = PyString::new(py, "").into_any();
        let fields: [PyObject; FIELD_COUNT] = fields.into_iter().chain([accepted, drafted, steps, empty.clone(), empty])
            .map(Bound::unbind).collect::<Vec<_>>().try_into()
            .map_err(|_| pyo3::exceptions::PyValueError::new_err("a record of the wrong number of fields"))?;
        let record = if native_segments {
            let segment_type = self.segment_type.clone_ref(py);
            RequestRecord::with_segments(fields, NativeSegments { segment_type, list: segments.into_boxed_slice() })
        } else {
            RequestRecord::new(fields)
        };
        Ok(Ok(Bound::new(py, record)?.into_any().unbind()))
    }
}

/// `python_sum` for the tests: Python's `sum()` of `values` (at least one), compensated or not.
#[pyfunction]
fn float_sum(values: Vec<f64>, compensated: bool) -> PyResult<f64> {
    if values.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err("float_sum needs at least one value"));
    }
    Ok(python_sum(&values, compensated))
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<RecordBuilder>()?;
    module.add_function(wrap_pyfunction!(float_sum, module)?)?;
    Ok(())
}
