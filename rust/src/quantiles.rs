//! `processor/tail_sampling/quantiles.py`'s `RollingQuantile` (the `slowest` policy's windows):
//! the same bins, slices, cache and IEEE operations (`math.log` and `**` are the C library's `log`
//! and `pow` in both), so a threshold is the same float. The Python class stays the reference
//! (`tests/test_native_core.py` drives both with the same values and clock).

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;

use crate::buffer::SpanSet;
use crate::record::{self, FieldRef, RecordRef};
use crate::records::STATUS_CODE_ERROR;

const BINS: usize = 200;
const MIN: f64 = 1e-4;
const GROWTH: f64 = 1.1;
const EXACT_BELOW: i64 = 200;
const REFRESH_S: f64 = 0.5;

/// Python's `int(x)` of a float, as the bin and slice arithmetic uses it: truncation, and the
/// errors `int()` raises for NaN and infinities.
fn truncated(x: f64) -> PyResult<i64> {
    if x.is_nan() {
        return Err(PyValueError::new_err("cannot convert float NaN to integer"));
    }
    if x.is_infinite() {
        return Err(PyOverflowError::new_err("cannot convert float infinity to integer"));
    }
    if !(x.abs() < 9.2e18) {
        return Err(PyOverflowError::new_err("a value past this core's integers"));
    }
    Ok(x.trunc() as i64)
}

fn bin_of(value: f64, log_growth: f64) -> PyResult<usize> {
    if value <= MIN {
        return Ok(0);
    }
    let index = 1 + truncated((value / MIN).ln() / log_growth)?;
    Ok(if index > (BINS - 1) as i64 { BINS - 1 } else { index as usize })
}

fn upper_edge(index: usize) -> f64 {
    MIN * GROWTH.powf(index as f64)
}

#[pyclass(module = "otel_llm._core")]
pub struct RollingQuantile {
    slice_s: f64,
    slices: usize,
    clock: PyObject,
    counts: Vec<[i64; BINS]>,
    slice_ids: Vec<i64>,
    merged: [i64; BINS],
    #[pyo3(get)]
    total: i64,
    cached: Vec<(f64, Option<f64>)>,
    cached_at: f64,
    added_since: i64,
    log_growth: f64,
}

impl RollingQuantile {
    fn current(&mut self, now: f64) -> PyResult<usize> {
        let slice_id = truncated(now / self.slice_s)?;
        let position = slice_id.rem_euclid(self.slices as i64) as usize;
        if self.slice_ids[position] != slice_id {
            self.expire(position);
            self.slice_ids[position] = slice_id;
            let oldest_live = slice_id - self.slices as i64 + 1;
            for other in 0..self.slices {
                if 0 <= self.slice_ids[other] && self.slice_ids[other] < oldest_live {
                    self.expire(other);
                }
            }
            self.cached.clear();
        }
        Ok(position)
    }

    fn expire(&mut self, position: usize) {
        if self.slice_ids[position] >= 0 {
            for index in 0..BINS {
                let count = self.counts[position][index];
                if count != 0 {
                    self.merged[index] -= count;
                    self.total -= count;
                }
            }
        }
        self.counts[position] = [0; BINS];
        self.slice_ids[position] = -1;
    }

    /// Whether a cached threshold still answers: the window is past its exact size, the answer
    /// younger than `REFRESH_S` and fewer than 1 % of the window added since.
    fn fresh(&self, now: f64) -> bool {
        self.total >= EXACT_BELOW && now - self.cached_at < REFRESH_S && self.added_since < self.total.div_euclid(100)
    }

    fn cached_of(&self, q: f64) -> Option<Option<f64>> {
        self.cached.iter().find(|(key, _)| *key == q).map(|(_, value)| *value)
    }

    fn compute(&self, q: f64) -> Option<f64> {
        if self.total <= 0 {
            return None;
        }
        let rank = q * self.total as f64;
        let mut running: i64 = 0;
        for (index, count) in self.merged.iter().enumerate() {
            running += count;
            if running as f64 >= rank {
                return Some(upper_edge(index));
            }
        }
        Some(upper_edge(BINS - 1))
    }

    fn quantile_at(&mut self, q: f64, now: f64) -> PyResult<Option<f64>> {
        self.current(now)?;
        let fresh = self.fresh(now);
        if fresh {
            if let Some(known) = self.cached_of(q) {
                return Ok(known);
            }
        }
        let result = self.compute(q);
        if !fresh {
            self.cached.clear();
            self.cached_at = now;
            self.added_since = 0;
        }
        match self.cached.iter_mut().find(|(key, _)| *key == q) {
            Some(entry) => entry.1 = result,
            None => self.cached.push((q, result)),
        }
        Ok(result)
    }

    fn add_at(&mut self, position: usize, value: f64) -> PyResult<()> {
        let index = bin_of(value, self.log_growth)?;
        self.counts[position][index] += 1;
        self.merged[index] += 1;
        self.total += 1;
        self.added_since += 1;
        Ok(())
    }

    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        self.clock.bind(py).call0()?.extract()
    }
}

#[pymethods]
impl RollingQuantile {
    #[new]
    #[pyo3(signature = (window_s, slices = 10, clock = None))]
    fn new(py: Python<'_>, window_s: f64, slices: usize, clock: Option<PyObject>) -> PyResult<Self> {
        if slices == 0 {
            return Err(PyValueError::new_err("slices must be at least 1"));
        }
        let clock = match clock {
            Some(clock) => clock,
            None => py.import("time")?.getattr("monotonic")?.unbind(),
        };
        Ok(RollingQuantile {
            slice_s: window_s / slices as f64,
            slices,
            clock,
            counts: vec![[0; BINS]; slices],
            slice_ids: vec![-1; slices],
            merged: [0; BINS],
            total: 0,
            cached: Vec::new(),
            cached_at: f64::NEG_INFINITY,
            added_since: 0,
            log_growth: GROWTH.ln(),
        })
    }

    fn add(&mut self, py: Python<'_>, value: f64) -> PyResult<()> {
        // Python bins the value before it reads the clock: a value it cannot bin changes nothing.
        bin_of(value, self.log_growth)?;
        let now = self.now(py)?;
        let position = self.current(now)?;
        self.add_at(position, value)
    }

    fn quantile(&mut self, py: Python<'_>, q: f64) -> PyResult<Option<f64>> {
        let now = self.now(py)?;
        self.quantile_at(q, now)
    }

    fn slice_at(&self, now: f64) -> PyResult<(i64, i64)> {
        let slice_id = truncated(now / self.slice_s)?;
        Ok((slice_id, slice_id.rem_euclid(self.slices as i64)))
    }

    fn quantile_then_add(&mut self, q: f64, value: f64, now: f64, slice_id: i64, position: usize) -> PyResult<Option<f64>> {
        if position >= self.slices {
            return Err(PyValueError::new_err("a slice position past the window's slices"));
        }
        if self.slice_ids[position] != slice_id {
            self.current(now)?;
        }
        let result = match self.cached_of(q) {
            Some(known) if self.fresh(now) => known,
            _ => self.quantile_at(q, now)?,
        };
        self.add_at(position, value)?;
        Ok(result)
    }
}

/// `policies.SlowestPolicy.matches`' loop and its windows (`_windows`, `_by_model`): for each
/// succeeded server-side record, each chosen metric's value against its model's rolling quantile,
/// then added to it, the clock read once per trace. The same attribute reads, comparisons and
/// window operations in the same order as the Python loop, which stays the reference
/// (`tests/unit/tail_sampling/test_policies.py` runs both on the same records and clock).
#[pyclass(module = "otel_llm._core")]
pub struct SlowestWindows {
    /// Per metric: the record attribute it reads, and its name in a window's key.
    attributes: Vec<FieldRef>,
    metrics: Vec<Py<pyo3::types::PyString>>,
    quantile: f64,
    window_s: f64,
    max_windows: usize,
    clock: PyObject,
    failed: PyObject,
    server: PyObject,
    other: Py<pyo3::types::PyString>,
    /// `_windows`: (model, metric) -> index in `windows`, never dropped.
    keys: Py<pyo3::types::PyDict>,
    windows: Vec<RollingQuantile>,
    /// `_by_model`: model -> index in `resolved`, each metric's window once resolved; bounded.
    by_model: Py<pyo3::types::PyDict>,
    resolved: Vec<Vec<Option<usize>>>,
    by_model_limit: usize,
}

impl SlowestWindows {
    /// `SlowestPolicy._window`: the model's window for a metric, past `max_models` the shared one.
    fn window(&mut self, py: Python<'_>, model: &Bound<'_, PyAny>, position: usize) -> PyResult<usize> {
        let keys = self.keys.bind(py);
        let metric = self.metrics[position].bind(py);
        let mut key = pyo3::types::PyTuple::new(py, [model.clone(), metric.clone().into_any()])?;
        let mut found = keys.get_item(&key)?;
        if found.is_none() {
            if keys.len() >= self.max_windows {
                key = pyo3::types::PyTuple::new(py, [self.other.bind(py).clone().into_any(), metric.clone().into_any()])?;
                found = keys.get_item(&key)?;
            }
            if found.is_none() {
                let index = self.windows.len();
                self.windows.push(RollingQuantile::new(py, self.window_s, 10, Some(self.clock.clone_ref(py)))?);
                keys.set_item(&key, index)?;
                return Ok(index);
            }
        }
        found.map_or(Ok(0), |index| index.extract::<usize>())
    }
}

#[pymethods]
impl SlowestWindows {
    /// `attributes`: the record attribute of each metric (`policies.METRIC_ATTRIBUTES`), `metrics` their
    /// names; `failed`: `Outcome.FAILED`; `server`: `Side.SERVER`; `other`: the overflow window's model.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, attributes: Vec<Py<pyo3::types::PyString>>, metrics: Vec<Py<pyo3::types::PyString>>,
           quantile: f64, window_s: f64, max_models: usize, by_model_limit: usize, clock: PyObject, failed: PyObject,
           server: PyObject, other: Py<pyo3::types::PyString>) -> PyResult<Self> {
        if attributes.len() != metrics.len() {
            return Err(PyValueError::new_err("one record attribute per metric"));
        }
        let fields: Vec<FieldRef> = attributes.into_iter().map(|name| FieldRef::new(name, py)).collect();
        Ok(SlowestWindows {
            max_windows: max_models * metrics.len(), attributes: fields, metrics, quantile, window_s, clock, failed, server,
            other, keys: pyo3::types::PyDict::new(py).unbind(), windows: Vec::new(),
            by_model: pyo3::types::PyDict::new(py).unbind(), resolved: Vec::new(), by_model_limit,
        })
    }

    /// How many models the per-model cache holds (bounded by `by_model_limit`; the tests read it).
    #[getter]
    fn cached_models(&self) -> usize {
        self.resolved.len()
    }

    /// Whether any request of `records` is slower than its model's window (or the window has no
    /// threshold yet); every value is added to its window whatever the answer.
    fn matches(&mut self, py: Python<'_>, records: &Bound<'_, PyAny>) -> PyResult<bool> {
        let mut slow = false;
        let mut now: Option<(f64, i64, i64)> = None;
        let failed = self.failed.clone_ref(py).into_bound(py);
        let server = self.server.clone_ref(py).into_bound(py);
        for record in records.try_iter()? {
            let record = record?;
            let read = RecordRef::of(&record);
            if failed.contains(read.known(record::OUTCOME)?)? || read.known(record::SIDE)?.ne(&server)? {
                continue;
            }
            let model = read.known(record::MODEL)?;
            let by_model = self.by_model.clone_ref(py).into_bound(py);
            let slot = match by_model.get_item(&model)? {
                Some(slot) => slot.extract::<usize>()?,
                None => {
                    if by_model.len() >= self.by_model_limit {
                        by_model.clear();
                        self.resolved.clear();
                    }
                    self.resolved.push(vec![None; self.attributes.len()]);
                    by_model.set_item(&model, self.resolved.len() - 1)?;
                    self.resolved.len() - 1
                }
            };
            for position in 0..self.attributes.len() {
                let value = read.read(&self.attributes[position])?;
                if value.is_none() {
                    continue;
                }
                let index = match self.resolved[slot][position] {
                    Some(index) => index,
                    None => {
                        let index = self.window(py, &model, position)?;
                        self.resolved[slot][position] = Some(index);
                        index
                    }
                };
                let (instant, slice_id, slice_position) = match now {
                    Some(known) => known,
                    None => {
                        let instant: f64 = self.clock.bind(py).call0()?.extract()?;
                        let (slice_id, slice_position) = self.windows[index].slice_at(instant)?;
                        now = Some((instant, slice_id, slice_position));
                        (instant, slice_id, slice_position)
                    }
                };
                let number: f64 = value.extract()?;
                let position_in_window = usize::try_from(slice_position)
                    .map_err(|_| PyValueError::new_err("a negative slice position"))?;
                let threshold = self.windows[index].quantile_then_add(self.quantile, number, instant, slice_id,
                                                                      position_in_window)?;
                match threshold {
                    None => slow = true,
                    // A float compares as Python compares it; anything else by Python's own `>`.
                    Some(limit) => {
                        let above = if value.is_exact_instance_of::<pyo3::types::PyFloat>() {
                            number > limit
                        } else {
                            value.gt(limit)?
                        };
                        slow |= above;
                    }
                }
            }
        }
        Ok(slow)
    }
}

/// One policy of a `Decider`, as `policies.py` defines it.
enum Rule {
    /// `ErrorsPolicy`: a failed request, or any span with status ERROR.
    Errors,
    /// `SlowestPolicy`, its loop and windows (`SlowestWindows`).
    Slowest(Py<SlowestWindows>),
    /// `ProbabilisticPolicy`: the trace id's last 56 bits at or above the threshold.
    Probabilistic(u64),
}

/// `sampler.TailSampler.decide`'s loop over the policies, for a configuration made only of the
/// errors, slowest and probabilistic policies: every policy sees every trace (the slowest one learns
/// from all traffic), and the first that matches is the answer. The caller holds the lock that
/// keeps two threads out of the slowest policy's windows.
#[pyclass(module = "otel_llm._core", frozen)]
pub struct Decider {
    rules: Vec<Rule>,
    failed: PyObject,
}

impl Decider {
    fn errors(&self, py: Python<'_>, spans: &SpanSet<'_, '_>, records: &Bound<'_, PyAny>)
              -> PyResult<bool> {
        let failed = self.failed.bind(py);
        for record in records.try_iter()? {
            let record = record?;
            if failed.contains(RecordRef::of(&record).known(record::OUTCOME)?)? {
                return Ok(true);
            }
        }
        for span in spans.values() {
            let error = match span.downcast::<crate::Row>() {
                Ok(row) => row.get().status_code == STATUS_CODE_ERROR,
                Err(_) => span.getattr(pyo3::intern!(py, "status_code"))?.eq(STATUS_CODE_ERROR)?,
            };
            if error {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl Decider {
    /// The index of the first policy that matches the trace (its spans as the core reads them), or -1.
    pub(crate) fn first_match_in(&self, py: Python<'_>, trace_id: &[u8], spans: &SpanSet<'_, '_>,
                                 records: &Bound<'_, PyAny>) -> PyResult<i64> {
        let mut matched: i64 = -1;
        for (index, rule) in self.rules.iter().enumerate() {
            let matches = match rule {
                Rule::Errors => self.errors(py, spans, records)?,
                Rule::Slowest(windows) => windows.bind(py).try_borrow_mut()?.matches(py, records)?,
                Rule::Probabilistic(threshold) => {
                    // `int.from_bytes(trace_id[9:16], "big")`: at most seven bytes.
                    let tail = trace_id.get(9..trace_id.len().min(16)).unwrap_or(&[]);
                    tail.iter().fold(0u64, |value, byte| value << 8 | u64::from(*byte)) >= *threshold
                }
            };
            if matches && matched < 0 {
                matched = index as i64;
            }
        }
        Ok(matched)
    }
}

#[pymethods]
impl Decider {
    /// `rules`: per policy in config order, `("errors", None)`, `("slowest", SlowestWindows)` or
    /// `("probabilistic", threshold)`; `failed`: `Outcome.FAILED`.
    #[new]
    fn new(rules: Vec<(String, PyObject)>, failed: PyObject, py: Python<'_>) -> PyResult<Self> {
        let mut built = Vec::with_capacity(rules.len());
        for (kind, value) in rules {
            built.push(match kind.as_str() {
                "errors" => Rule::Errors,
                "slowest" => Rule::Slowest(value.extract::<Py<SlowestWindows>>(py)?),
                "probabilistic" => Rule::Probabilistic(value.extract::<u64>(py)?),
                other => return Err(PyValueError::new_err(format!("a policy the core does not run: {other:?}"))),
            });
        }
        Ok(Decider { rules: built, failed })
    }

    /// The index of the first policy that matches the trace, or -1.
    fn first_match(&self, py: Python<'_>, trace_id: &[u8], spans: Bound<'_, pyo3::types::PyDict>,
                   records: &Bound<'_, PyAny>) -> PyResult<i64> {
        self.first_match_in(py, trace_id, &SpanSet::Dict(spans), records)
    }

    /// `first_match` of each (trace id, spans, records), in order, in one call (a completion
    /// batch's): the index, or in its place the exception its policies raised.
    fn first_match_many(&self, py: Python<'_>,
                        traces: Vec<(Bound<'_, pyo3::types::PyBytes>, Bound<'_, pyo3::types::PyDict>, Bound<'_, PyAny>)>)
                        -> PyResult<Py<pyo3::types::PyList>> {
        let mut matched: Vec<PyObject> = Vec::with_capacity(traces.len());
        for (trace_id, spans, records) in traces {
            matched.push(match self.first_match_in(py, trace_id.as_bytes(), &SpanSet::Dict(spans), &records) {
                Ok(index) => index.into_pyobject(py)?.into_any().unbind(),
                Err(error) => error.into_value(py).into_any(),
            });
        }
        Ok(pyo3::types::PyList::new(py, matched)?.unbind())
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<RollingQuantile>()?;
    module.add_class::<SlowestWindows>()?;
    module.add_class::<Decider>()
}
