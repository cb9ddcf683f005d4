//! The metrics recorder's per-record loop (`processor/llm_metrics/metrics/recorder.py`): the
//! observations of one side's namings and a record's segments, into histogram series whose
//! buckets, sum and count are Rust numbers.
//!
//! Python builds everything this runs from: the recording plan (`recorder.py` `_native_ops`, the
//! same walk over the namings' specs as the generated Python observer, so series are created and
//! draw on the byte budget in the same order), the label-key caches, the families and the calls
//! for what is rare (a new cache entry, a new series, an overflow count, a counter's new key,
//! exponential buckets). This file only does what the generated observer does per record, with
//! the same IEEE operations: a bucket by `bisect_left`'s comparisons, `count += weight`,
//! `sum += value * weight`. The Python observer stays the reference
//! (`tests/unit/llm_metrics/test_recorder_reference.py` runs both against a plain reference).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyFloat, PyList, PyString, PyTuple};

use crate::record::{self, FieldRef, RecordRef};

/// One histogram series: per-bucket counts (the last one +Inf), sum and count as the Python
/// `families.HistogramSeries` holds them, read through the same attribute names.
#[pyclass(module = "otel_llm._core", name = "HistogramSeries")]
pub struct Series {
    counts: Vec<f64>,
    total: f64,
    count: f64,
    exemplars: Py<PyDict>,
    // The latest exemplar of each bucket as its parts, made the class's object (`families.Exemplar`)
    // in `exemplars` when read: a kept trace's ~20 observations made 20 objects (a frozen dataclass's
    // `__init__` each) and replaced 20 in the dict, nearly all overwritten before a scrape reads one.
    pending: Vec<Option<PendingExemplar>>,
    bounds: Py<PyTuple>,
    own_bounds: Vec<f64>,
    exponential: PyObject,
}

/// `Exemplar(trace_id, span_id, value, timestamp)`'s arguments, and the class to make it with.
struct PendingExemplar {
    class: PyObject,
    trace_id: PyObject,
    span_id: PyObject,
    value: PyObject,
    timestamp: f64,
}

impl Series {
    /// The pending exemplars made objects in `exemplars`, in bucket order (each overwrites its bucket's).
    fn settle(&mut self, py: Python<'_>) -> PyResult<()> {
        let exemplars = self.exemplars.bind(py);
        for (index, slot) in self.pending.iter_mut().enumerate() {
            if let Some(pending) = slot.take() {
                let made = pending.class.bind(py).call1((pending.trace_id, pending.span_id, pending.value,
                                                         pending.timestamp))?;
                exemplars.set_item(index, made)?;
            }
        }
        Ok(())
    }
}

#[pymethods]
impl Series {
    /// `buckets` counts of zero; `bounds` its own upper bounds (`()`: the family's), `exponential`
    /// the exponential state it keeps too, or None.
    #[new]
    fn new(py: Python<'_>, buckets: usize, bounds: Bound<'_, PyTuple>, exponential: PyObject) -> PyResult<Self> {
        let own_bounds: Vec<f64> = bounds.extract()?;
        if !own_bounds.is_empty() && own_bounds.len() + 1 != buckets {
            return Err(PyValueError::new_err("a series with bounds of its own has one bucket more than them"));
        }
        Ok(Series {
            counts: vec![0.0; buckets],
            total: 0.0,
            count: 0.0,
            exemplars: PyDict::new(py).unbind(),
            pending: Vec::new(),
            bounds: bounds.unbind(),
            own_bounds,
            exponential,
        })
    }

    /// A copy: the series is read at exposition, written only here.
    #[getter]
    fn counts(&self) -> Vec<f64> {
        self.counts.clone()
    }

    #[getter]
    fn total(&self) -> f64 {
        self.total
    }

    #[getter]
    fn count(&self) -> f64 {
        self.count
    }

    /// Bucket index -> `Exemplar`, the latest of each bucket.
    #[getter]
    fn exemplars(&mut self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        self.settle(py)?;
        Ok(self.exemplars.clone_ref(py))
    }

    #[getter]
    fn bounds(&self, py: Python<'_>) -> Py<PyTuple> {
        self.bounds.clone_ref(py)
    }

    #[getter]
    fn exponential(&self, py: Python<'_>) -> PyObject {
        self.exponential.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        format!("HistogramSeries(counts={:?}, total={:?}, count={:?})", self.counts, self.total, self.count)
    }
}

/// One counter series' total, as a cell its observer adds to in place (`families.CounterFamily`
/// with the core: its series dict holds these instead of floats, so a record's counter step is an
/// addition, not a dict lookup and store of a new float under a hashed tuple key).
#[pyclass(module = "otel_llm._core", name = "CounterSeries")]
pub struct CounterSeries {
    value: f64,
}

#[pymethods]
impl CounterSeries {
    #[new]
    fn new() -> Self {
        CounterSeries { value: 0.0 }
    }

    /// `value += amount`, the float addition Python's `current + amount` does.
    fn add(&mut self, amount: f64) {
        self.value += amount;
    }

    fn __float__(&self) -> f64 {
        self.value
    }

    fn __repr__(&self) -> String {
        format!("CounterSeries({:?})", self.value)
    }
}

/// Python's `bisect_left(bounds, value)` for a float: the first bound not less than `value`
/// (`value == bound` falls in that bucket; NaN in the first, as Python's comparisons put it).
#[inline]
fn bisect_left(bounds: &[f64], value: f64) -> usize {
    let (mut lo, mut hi) = (0usize, bounds.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if bounds[mid] < value {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

// What an observation does besides its bucket, sum and count (recorder.py `_OVERFLOWED`, `_EXPONENTIAL`).
const OVERFLOWED: i64 = 1;
const EXPONENTIAL: i64 = 2;

/// Adds one observation to `series`: the Python observer's bucket, count and sum, then what the
/// series' flag word asks for and the exemplar.
#[allow(clippy::too_many_arguments)]
fn observe_into<'py>(py: Python<'py>, series_object: &Bound<'py, PyAny>, family_bounds: &[f64], own_bounds_apply: bool,
                     value: Option<&Bound<'py, PyAny>>, number: f64, weight: f64, extra: i64, family: &Bound<'py, PyAny>,
                     exemplar: Option<&Exemplars<'py>>) -> PyResult<()> {
    // The observed value as Python passes it on (the object itself, or a float of `number` for a
    // segment's duration), made only where the exponential state or an exemplar takes it.
    let value_object = || value.cloned().unwrap_or_else(|| PyFloat::new(py, number).into_any());
    let cell = series_object.downcast::<Series>()?;
    let index;
    let exponential;
    {
        let mut series = cell.borrow_mut();
        let bounds = if own_bounds_apply && !series.own_bounds.is_empty() { &series.own_bounds } else { family_bounds };
        index = bisect_left(bounds, number);
        if index >= series.counts.len() {
            return Err(PyValueError::new_err("a series with fewer buckets than its family's bounds"));
        }
        series.counts[index] += weight;
        series.total += number * weight;
        series.count += weight;
        exponential = if extra & EXPONENTIAL != 0 { Some(series.exponential.clone_ref(py)) } else { None };
    }
    if extra != 0 {
        if let Some(state) = exponential {
            state.bind(py).call_method1(pyo3::intern!(py, "observe"), (value_object(), weight))?;
        }
        if extra & OVERFLOWED != 0 {
            let name = pyo3::intern!(py, "overflowed");
            let overflowed = family.getattr(name)?;
            family.setattr(name, overflowed.add(1)?)?;
        }
    }
    if let Some(exemplar) = exemplar {
        let pending = PendingExemplar {
            class: exemplar.class.clone().unbind(), trace_id: exemplar.trace_id.clone().unbind(),
            span_id: exemplar.span_id.clone().unbind(), value: value_object().unbind(), timestamp: exemplar.now,
        };
        let mut series = cell.borrow_mut();
        if series.pending.len() <= index {
            series.pending.resize_with(index + 1, || None);
        }
        series.pending[index] = Some(pending);
    }
    Ok(())
}

/// What an exemplar links to (a kept trace's ids and the time it was recorded).
struct Exemplars<'py> {
    class: &'py Bound<'py, PyAny>,
    trace_id: &'py Bound<'py, PyAny>,
    span_id: &'py Bound<'py, PyAny>,
    now: f64,
}

/// A spec's value, as `recorder.py` `_native_ops` declares it: a field, a constant, a value computed
/// from fields as `definitions.py`'s `Difference`, `Ratio` and `UnlessAtMost` compute it (with
/// CPython's number protocol and truth test, so the same object as Python's operators give), a
/// call back to Python, or one of the values computed once per record first.
enum Value {
    Field(FieldRef),
    Constant(PyObject),
    Difference(FieldRef, FieldRef),
    Ratio(FieldRef, FieldRef, Option<PyObject>),
    UnlessAtMost(FieldRef, FieldRef, PyObject),
    Call(PyObject),
    Shared(usize),
}

fn field_ref(item: Bound<'_, PyAny>) -> PyResult<FieldRef> {
    let py = item.py();
    Ok(FieldRef::new(item.downcast_into::<PyString>()?.unbind(), py))
}

impl Value {
    fn of(spec: &Bound<'_, PyTuple>) -> PyResult<Value> {
        let kind: String = spec.get_item(0)?.extract()?;
        let what = spec.get_item(1)?;
        Ok(match kind.as_str() {
            "field" => Value::Field(field_ref(what)?),
            "constant" => Value::Constant(what.unbind()),
            "difference" => Value::Difference(field_ref(what.get_item(0)?)?, field_ref(what.get_item(1)?)?),
            "ratio" => {
                let offset = what.get_item(2)?;
                Value::Ratio(field_ref(what.get_item(0)?)?, field_ref(what.get_item(1)?)?,
                             if offset.is_none() { None } else { Some(offset.unbind()) })
            }
            "unless_at_most" => Value::UnlessAtMost(field_ref(what.get_item(0)?)?, field_ref(what.get_item(1)?)?,
                                                    what.get_item(2)?.unbind()),
            "call" => Value::Call(what.unbind()),
            "shared" => Value::Shared(what.extract()?),
            other => return Err(PyValueError::new_err(format!("unknown value kind {other:?}"))),
        })
    }

    fn read<'py>(&self, py: Python<'py>, record: &RecordRef<'_, 'py>, shared: &[Bound<'py, PyAny>]) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Value::Field(field) => record.read(field),
            Value::Constant(value) => Ok(value.bind(py).clone()),
            Value::Difference(minuend, subtrahend) => {
                let (minuend, subtrahend) = (record.read(minuend)?, record.read(subtrahend)?);
                if minuend.is_none() || subtrahend.is_none() {
                    return Ok(py.None().into_bound(py));
                }
                minuend.sub(subtrahend)
            }
            Value::Ratio(numerator, denominator, offset) => {
                let (numerator, denominator) = (record.read(numerator)?, record.read(denominator)?);
                if numerator.is_none() || !denominator.is_truthy()? {
                    return Ok(py.None().into_bound(py));
                }
                let quotient = numerator.div(denominator)?;
                match offset {
                    None => Ok(quotient),
                    Some(offset) => offset.bind(py).add(quotient),
                }
            }
            Value::UnlessAtMost(field, guard, limit) => {
                let guard = record.read(guard)?;
                if !guard.is_none() && guard.le(limit.bind(py))? {
                    return Ok(py.None().into_bound(py));
                }
                record.read(field)
            }
            Value::Call(function) => function.bind(py).call1((record.object,)),
            Value::Shared(index) => Ok(shared[*index].clone()),
        }
    }
}

impl Value {
    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Value::Constant(object) | Value::Call(object) => visit.call(object),
            Value::Ratio(_, _, offset) => visit.call(offset),
            Value::UnlessAtMost(_, _, limit) => visit.call(limit),
            Value::Field(_) | Value::Difference(..) | Value::Shared(_) => Ok(()),
        }
    }
}

/// A label value: a record's field, or `Either`'s `first or fallback`.
enum LabelField {
    Field(FieldRef),
    Either(FieldRef, FieldRef),
}

impl LabelField {
    fn of(item: Bound<'_, PyAny>) -> PyResult<LabelField> {
        Ok(if item.is_instance_of::<PyTuple>() {
            LabelField::Either(field_ref(item.get_item(0)?)?, field_ref(item.get_item(1)?)?)
        } else {
            LabelField::Field(field_ref(item)?)
        })
    }

    fn read<'py>(&self, record: &RecordRef<'_, 'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            LabelField::Field(field) => record.read(field),
            LabelField::Either(first, fallback) => {
                let value = record.read(first)?;
                if value.is_truthy()? { Ok(value) } else { record.read(fallback) }
            }
        }
    }
}

struct KeyOp {
    group: usize,
    fields: Option<Vec<LabelField>>,
    labels: PyObject,
    cache: Py<PyDict>,
    plan: PyObject,
    cache_limit: usize,
}

struct HistOp {
    group: usize,
    position: usize,
    count: usize,
    value: Value,
    success_only: bool,
    per_step: Option<Value>,
    family: PyObject,
    bounds: Vec<f64>,
    by_model: bool,
    suffix: Option<Py<PyTuple>>,
}

struct CounterOp {
    group: usize,
    value: Value,
    by_outcome: bool,
    family: PyObject,
    series: Py<PyDict>,
    suffix: Option<Py<PyTuple>>,
}

enum Op {
    Key(KeyOp),
    Hist(HistOp),
    Counter(CounterOp),
}

fn suffix_of(item: Bound<'_, PyAny>) -> PyResult<Option<Py<PyTuple>>> {
    let tuple = item.downcast_into::<PyTuple>()?;
    Ok(if tuple.is_empty() { None } else { Some(tuple.unbind()) })
}

/// Bucket bounds as the recorder compares them: finite and below 2^53 in magnitude, so a value's
/// float compares with each bound as the value itself does (an integer count included).
fn checked_bounds(item: Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    let bounds: Vec<f64> = item.extract()?;
    if bounds.iter().any(|b| !(b.abs() < 9_007_199_254_740_992.0)) {
        return Err(PyValueError::new_err("bucket bounds past 2^53 are the Python observer's"));
    }
    Ok(bounds)
}

/// A counter's series key for one label-key cache entry, counter step and outcome: the tuple the
/// generated observer builds per record (`key + suffix + (outcome,)`), built once. The entry and
/// the outcome are held, so the addresses that name them are not reused while this is kept.
struct CounterKey {
    _entry: Py<PyList>,
    _outcome: Option<PyObject>,
    key: Py<PyTuple>,
    // The series the key names, once its family holds it (series are never removed from a family).
    cell: Option<Py<CounterSeries>>,
}

/// One side's recording loop (`recorder.py` `_compile`), run as its plan says.
#[pyclass(module = "otel_llm._core")]
pub struct Observer {
    shared: Vec<Value>,
    ops: Vec<Op>,
    groups: usize,
    new_slots: PyObject,
    resolve: PyObject,
    exemplar: PyObject,
    overflow: Py<PyTuple>,
    with_exemplars: bool,
    counter_keys: std::collections::HashMap<(usize, usize, usize), CounterKey>,
    counter_keys_limit: usize,
}

#[pymethods]
impl Observer {
    /// `ops`: tuples ("key", group, label fields or None, labels callable, cache, plan, cache limit),
    /// ("hist", group, position, count, value, success only, per-step values (a value, as below, that
    /// is a sequence) or None, family, bounds, per-model bounds, key suffix), ("counter", group, value,
    /// by outcome, family, its series dict, key suffix); a label field is a name or (first, fallback); a value is ("field",
    /// name), ("constant", v), ("difference", (minuend, subtrahend)), ("ratio", (numerator,
    /// denominator, offset or None)), ("unless_at_most", (name, guard, limit)), ("call", f) or
    /// ("shared", index into `shared`: the values computed once per record first, none of them shared).
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(ops: Vec<Bound<'_, PyTuple>>, shared: Vec<Bound<'_, PyTuple>>, new_slots: PyObject, resolve: PyObject,
           exemplar: PyObject, overflow: Bound<'_, PyTuple>, with_exemplars: bool) -> PyResult<Self> {
        let mut built = Vec::with_capacity(ops.len());
        let mut groups = 0usize;
        for op in ops {
            let kind: String = op.get_item(0)?.extract()?;
            let group: usize = op.get_item(1)?.extract()?;
            groups = groups.max(group + 1);
            built.push(match kind.as_str() {
                "key" => {
                    let fields = op.get_item(2)?;
                    Op::Key(KeyOp {
                        group,
                        fields: if fields.is_none() {
                            None
                        } else {
                            Some(fields.try_iter()?.map(|item| LabelField::of(item?)).collect::<PyResult<_>>()?)
                        },
                        labels: op.get_item(3)?.unbind(),
                        cache: op.get_item(4)?.downcast_into::<PyDict>()?.unbind(),
                        plan: op.get_item(5)?.unbind(),
                        cache_limit: op.get_item(6)?.extract()?,
                    })
                }
                "hist" => {
                    let per_step = op.get_item(6)?;
                    Op::Hist(HistOp {
                        group,
                        position: op.get_item(2)?.extract()?,
                        count: op.get_item(3)?.extract()?,
                        value: Value::of(op.get_item(4)?.downcast()?)?,
                        success_only: op.get_item(5)?.extract()?,
                        per_step: if per_step.is_none() { None } else { Some(Value::of(per_step.downcast()?)?) },
                        family: op.get_item(7)?.unbind(),
                        bounds: checked_bounds(op.get_item(8)?)?,
                        by_model: op.get_item(9)?.extract()?,
                        suffix: suffix_of(op.get_item(10)?)?,
                    })
                }
                "counter" => Op::Counter(CounterOp {
                    group,
                    value: Value::of(op.get_item(2)?.downcast()?)?,
                    by_outcome: op.get_item(3)?.extract()?,
                    family: op.get_item(4)?.unbind(),
                    series: op.get_item(5)?.downcast_into::<PyDict>()?.unbind(),
                    suffix: suffix_of(op.get_item(6)?)?,
                }),
                other => return Err(PyValueError::new_err(format!("unknown recording step {other:?}"))),
            });
        }
        // Bounded as the label-key caches are: a hostile flood of keys clears it.
        let counter_keys_limit = built.iter().map(|op| match op { Op::Key(k) => k.cache_limit, _ => 0 }).sum::<usize>()
            .saturating_mul(4).max(64);
        let shared: Vec<Value> = shared.iter().map(Value::of).collect::<PyResult<_>>()?;
        if shared.iter().any(|value| matches!(value, Value::Shared(_))) {
            return Err(PyValueError::new_err("a value computed once per record is not itself a shared one"));
        }
        Ok(Observer { shared, ops: built, groups, new_slots, resolve, exemplar, overflow: overflow.unbind(), with_exemplars,
                      counter_keys: std::collections::HashMap::new(), counter_keys_limit })
    }

    /// The objects it holds, for the cyclic garbage collector: its plan holds the recorder's bound
    /// methods, caches and families, so a recorder that is no longer referenced is in a cycle
    /// through it (collected once the collector can see the cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for value in &self.shared {
            value.visit(&visit)?;
        }
        for op in &self.ops {
            match op {
                Op::Key(key) => {
                    visit.call(&key.labels)?;
                    visit.call(&key.cache)?;
                    visit.call(&key.plan)?;
                }
                Op::Hist(hist) => {
                    hist.value.visit(&visit)?;
                    if let Some(per_step) = &hist.per_step {
                        per_step.visit(&visit)?;
                    }
                    visit.call(&hist.family)?;
                    visit.call(&hist.suffix)?;
                }
                Op::Counter(counter) => {
                    counter.value.visit(&visit)?;
                    visit.call(&counter.family)?;
                    visit.call(&counter.series)?;
                    visit.call(&counter.suffix)?;
                }
            }
        }
        for known in self.counter_keys.values() {
            visit.call(&known._entry)?;
            visit.call(&known._outcome)?;
            visit.call(&known.key)?;
            visit.call(&known.cell)?;
        }
        visit.call(&self.new_slots)?;
        visit.call(&self.resolve)?;
        visit.call(&self.exemplar)?;
        visit.call(&self.overflow)
    }

    /// The generated observer's signature and result: the first label too long for a series, or "".
    #[allow(clippy::too_many_arguments)]
    fn __call__<'py>(&mut self, py: Python<'py>, record: &Bound<'py, PyAny>, weight: f64, succeeded: bool,
                     dimensions: &Bound<'py, PyTuple>, trace_id: &Bound<'py, PyAny>, span_id: &Bound<'py, PyAny>,
                     now: f64) -> PyResult<Bound<'py, PyAny>> {
        let read = RecordRef::of(record);
        let mut shared: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.shared.len());
        for value in &self.shared {
            let computed = value.read(py, &read, &shared)?;
            shared.push(computed);
        }
        let mut keys: Vec<Option<Bound<'py, PyTuple>>> = vec![None; self.groups];
        let mut slots: Vec<Option<Bound<'py, PyList>>> = vec![None; self.groups];
        let mut too_long_of: Vec<bool> = vec![false; self.groups];
        let mut too_long: Option<Bound<'py, PyAny>> = None;
        let exemplar_class = self.exemplar.bind(py);
        let exemplars = Exemplars { class: exemplar_class, trace_id, span_id, now };
        let exemplar = if self.with_exemplars { Some(&exemplars) } else { None };
        let mut outcome: Option<Bound<'py, PyAny>> = None;
        for (step, op) in self.ops.iter().enumerate() {
            match op {
                Op::Key(key_op) => {
                    let mut key = match &key_op.fields {
                        Some(names) => {
                            let mut items = Vec::with_capacity(names.len() + dimensions.len());
                            for name in names {
                                items.push(name.read(&read)?);
                            }
                            items.extend(dimensions.iter());
                            PyTuple::new(py, items)?
                        }
                        None => key_op.labels.bind(py).call1((record,))?.add(dimensions)?.downcast_into::<PyTuple>()?,
                    };
                    let cache = key_op.cache.bind(py);
                    let found = match cache.get_item(&key)? {
                        Some(found) => found,
                        None => {
                            if cache.len() >= key_op.cache_limit {
                                cache.clear();
                            }
                            let made = self.new_slots.bind(py).call1((key_op.plan.bind(py), &key))?;
                            cache.set_item(&key, &made)?;
                            made
                        }
                    };
                    let list = found.downcast_into::<PyList>()?;
                    let last = list.get_item(list.len().wrapping_sub(1))?;
                    let long = last.is_truthy()?;
                    if long {
                        key = self.overflow.bind(py).clone();
                        if too_long.as_ref().map_or(Ok(true), |t| t.is_truthy().map(|b| !b))? {
                            too_long = Some(last);
                        }
                    }
                    too_long_of[key_op.group] = long;
                    keys[key_op.group] = Some(key);
                    slots[key_op.group] = Some(list);
                }
                Op::Hist(h) => {
                    if h.success_only && !succeeded {
                        continue;
                    }
                    let (Some(key), Some(list)) = (&keys[h.group], &slots[h.group]) else {
                        return Err(PyValueError::new_err("a histogram step before its key"));
                    };
                    let family = h.family.bind(py);
                    let observe = |value: Bound<'py, PyAny>| -> PyResult<()> {
                        let number: f64 = value.extract()?;
                        let mut series = list.get_item(h.position)?;
                        if series.is_none() {
                            let series_key = match &h.suffix {
                                Some(suffix) => key.add(suffix.bind(py))?,
                                None => key.clone().into_any(),
                            };
                            series = self.resolve.bind(py).call1((list, h.position, h.count, family, series_key))?;
                        }
                        let extra: i64 = list.get_item(h.count + h.position)?.extract()?;
                        observe_into(py, &series, &h.bounds, h.by_model, Some(&value), number, weight, extra, family, exemplar)
                    };
                    match &h.per_step {
                        None => {
                            let value = h.value.read(py, &read, &shared)?;
                            if !value.is_none() {
                                observe(value)?;
                            }
                        }
                        Some(steps) => {
                            for value in steps.read(py, &read, &shared)?.try_iter()? {
                                observe(value?)?;
                            }
                        }
                    }
                }
                Op::Counter(c) => {
                    let amount = c.value.read(py, &read, &shared)?;
                    if amount.is_none() {
                        continue;
                    }
                    let (Some(key), Some(entry)) = (&keys[c.group], &slots[c.group]) else {
                        return Err(PyValueError::new_err("a counter step before its key"));
                    };
                    let added = amount.extract::<f64>()? * weight;
                    let family = c.family.bind(py);
                    if too_long_of[c.group] {
                        family.call_method1(pyo3::intern!(py, "add_overflow"), (added,))?;
                        continue;
                    }
                    if c.by_outcome && outcome.is_none() {
                        outcome = Some(read.known(record::OUTCOME)?);
                    }
                    let outcome_of_key = if c.by_outcome { outcome.as_ref() } else { None };
                    let cached = (entry.as_ptr() as usize, step, outcome_of_key.map_or(0, |o| o.as_ptr() as usize));
                    let counter_key = match self.counter_keys.get(&cached) {
                        Some(CounterKey { cell: Some(cell), .. }) => {
                            cell.bind(py).borrow_mut().value += added;
                            continue;
                        }
                        Some(known) => known.key.bind(py).clone(),
                        None => {
                            let mut built = match &c.suffix {
                                Some(suffix) => key.add(suffix.bind(py))?,
                                None => key.clone().into_any(),
                            };
                            if let Some(outcome) = outcome_of_key {
                                built = built.add(PyTuple::new(py, [outcome])?)?;
                            }
                            let built = built.downcast_into::<PyTuple>()?;
                            if self.counter_keys.len() >= self.counter_keys_limit {
                                self.counter_keys.clear();
                            }
                            self.counter_keys.insert(cached, CounterKey {
                                _entry: entry.clone().unbind(),
                                _outcome: outcome_of_key.map(|o| o.clone().unbind()),
                                key: built.clone().unbind(),
                                cell: None,
                            });
                            built
                        }
                    };
                    let series = c.series.bind(py);
                    match series.get_item(&counter_key)? {
                        None => {
                            // A new series (or the overflow one, counted), made by the family.
                            family.call_method1(pyo3::intern!(py, "add"), (counter_key, added))?;
                        }
                        Some(current) => {
                            // The recorder gives its core's counter families cells (`cell_class`) before any record.
                            let cell = current.downcast_into::<CounterSeries>()?;
                            cell.borrow_mut().value += added;
                            if let Some(known) = self.counter_keys.get_mut(&cached) {
                                known.cell = Some(cell.unbind());
                            }
                        }
                    }
                }
            }
        }
        Ok(match too_long {
            Some(label) => label,
            None => pyo3::intern!(py, "").clone().into_any(),
        })
    }
}

/// A record's segments into the segment family's series (`MetricsRecorder.record`'s loop, part of
/// `Recording`), the family's bounds checked and held once. Per record: `by_name` the key's cache of segment name ->
/// (series, flag word), `everything` the overflow entry every segment of a too-long key goes to
/// (or None), `resolve(name)` the entry for a name not yet cached. Durations as Python computes
/// them: `(end - start) / 1e9`.
struct SegmentObserver {
    bounds: Vec<f64>,
    family: PyObject,
    exemplar: PyObject,
}

impl SegmentObserver {
    #[allow(clippy::too_many_arguments)]
    fn observe<'py>(&self, py: Python<'py>, segments: &Bound<'py, PyAny>, by_name: &Bound<'py, PyDict>,
                    everything: Option<&Bound<'py, PyAny>>, resolve: impl Fn(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
                    weight: f64, trace_id: &Bound<'py, PyAny>, span_id: &Bound<'py, PyAny>, now: Option<f64>) -> PyResult<()> {
        for segment in segments.try_iter()? {
            let segment = segment?;
            let (start, end) = (wide_int(&segment.get_item(1)?)?, wide_int(&segment.get_item(2)?)?);
            self.observe_one(py, &segment.get_item(0)?, start, end, by_name, everything, &resolve, weight,
                             (trace_id, span_id, now))?;
        }
        Ok(())
    }

    /// `observe` of segments the core's record holds as numbers (the same names, durations and series).
    #[allow(clippy::too_many_arguments)]
    fn observe_native<'py>(&self, py: Python<'py>, segments: &[(&'static str, i64, i64)], by_name: &Bound<'py, PyDict>,
                           everything: Option<&Bound<'py, PyAny>>,
                           resolve: impl Fn(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
                           weight: f64, trace_id: &Bound<'py, PyAny>, span_id: &Bound<'py, PyAny>, now: Option<f64>)
                           -> PyResult<()> {
        for &(name, start, end) in segments {
            let name = crate::segment_name(py, name).into_any();
            self.observe_one(py, &name, i128::from(start), i128::from(end), by_name, everything, &resolve, weight,
                             (trace_id, span_id, now))?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn observe_one<'py>(&self, py: Python<'py>, name: &Bound<'py, PyAny>, start: i128, end: i128,
                        by_name: &Bound<'py, PyDict>, everything: Option<&Bound<'py, PyAny>>,
                        resolve: &impl Fn(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>, weight: f64,
                        (trace_id, span_id, now): (&Bound<'py, PyAny>, &Bound<'py, PyAny>, Option<f64>)) -> PyResult<()> {
        let class = self.exemplar.bind(py);
        let exemplars = now.map(|now| Exemplars { class, trace_id, span_id, now });
        // int - int is exact in Python; int / float rounds the difference to a float first.
        let duration = (end - start) as f64 / 1e9;
        let resolved = match everything {
            Some(everything) => everything.clone(),
            None => match by_name.get_item(name)? {
                Some(found) => found,
                None => resolve(name)?,
            },
        };
        let series = resolved.get_item(0)?;
        let extra: i64 = resolved.get_item(1)?.extract()?;
        observe_into(py, &series, &self.bounds, false, None, duration, weight, extra, self.family.bind(py),
                     exemplars.as_ref())
    }
}

/// A record's segments: the core's record's numbers, or any other record's `Segment` tuples.
enum Segments<'a, 'py> {
    Numbers(&'a [(&'static str, i64, i64)]),
    Objects(Bound<'py, PyAny>),
}

/// `MetricsRecorder.record` with the compiled core, called under the recorder's lock: a record's
/// observations in its side's namings (`Observer`), its segments (`SegmentObserver`, through the
/// recorder's segment-key cache), and the count of the first label too long for a series. Python
/// makes what is rare: a segment key's cache entry (`_segment_entry`) and a segment series
/// (`_resolve_segment`).
#[pyclass(module = "otel_llm._core")]
pub struct Recording {
    observers: Py<PyDict>,
    segments: SegmentObserver,
    segment_cache: Py<PyDict>,
    segment_too_long: Py<PyDict>,
    too_long: Py<PyDict>,
    segment_entry: PyObject,
    resolve_segment: PyObject,
    failed: PyObject,
    clock: PyObject,
    recorded: u64,
}

#[pymethods]
impl Recording {
    /// `observers`: side -> (observer, observer with exemplars); `segment_bounds`, `segment_family`:
    /// the segment family's; `exemplar`: the exemplar class; `too_long`: the recorder's count by
    /// label; `failed`: the outcomes that are not successes; `clock`: an exemplar's timestamp (`time.time`).
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(observers: Py<PyDict>, segment_bounds: Bound<'_, PyAny>, segment_family: PyObject, exemplar: PyObject,
           segment_cache: Py<PyDict>, segment_too_long: Py<PyDict>, too_long: Py<PyDict>, segment_entry: PyObject,
           resolve_segment: PyObject, failed: PyObject, clock: PyObject) -> PyResult<Self> {
        let segments = SegmentObserver { bounds: checked_bounds(segment_bounds)?, family: segment_family, exemplar };
        Ok(Recording { observers, segments, segment_cache, segment_too_long, too_long, segment_entry, resolve_segment,
                       failed, clock, recorded: 0 })
    }

    /// See `Observer.__traverse__`: it holds the recorder's caches and bound methods.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.observers)?;
        visit.call(&self.segments.family)?;
        visit.call(&self.segments.exemplar)?;
        visit.call(&self.segment_cache)?;
        visit.call(&self.segment_too_long)?;
        visit.call(&self.too_long)?;
        visit.call(&self.segment_entry)?;
        visit.call(&self.resolve_segment)?;
        visit.call(&self.failed)?;
        visit.call(&self.clock)
    }

    /// Records recorded (`MetricsRecorder.requests_recorded`).
    #[getter]
    fn recorded(&self) -> u64 {
        self.recorded
    }

    pub(crate) fn record<'py>(&mut self, py: Python<'py>, record: &Bound<'py, PyAny>, with_exemplars: bool)
                              -> PyResult<()> {
        let read = RecordRef::of(record);
        let weight: f64 = read.known(record::WEIGHT)?.extract()?;
        let succeeded = !self.failed.bind(py).contains(read.known(record::OUTCOME)?)?;
        let empty = pyo3::intern!(py, "").clone().into_any();
        let (trace_id, span_id, now) = if with_exemplars {
            let hex = pyo3::intern!(py, "hex");
            (read.known(record::TRACE_ID)?.call_method0(hex)?, read.known(record::SPAN_ID)?.call_method0(hex)?,
             self.clock.bind(py).call0()?.extract::<f64>()?)
        } else {
            (empty.clone(), empty.clone(), 0.0)
        };
        let dimensions = read.known(record::DIMENSIONS)?.downcast_into::<PyTuple>()?;
        self.recorded += 1;
        let mut too_long = empty;
        if let Some(pair) = self.observers.bind(py).get_item(read.known(record::SIDE)?)? {
            let observer = pair.get_item(usize::from(with_exemplars))?.downcast_into::<Observer>()?;
            too_long = observer.borrow_mut().__call__(py, record, weight, succeeded, &dimensions, &trace_id, &span_id, now)?;
        }
        // The core's records hold their segments as numbers: read so, no named tuple made.
        let segments = match read.native_segments() {
            Some(list) => Segments::Numbers(list),
            None => Segments::Objects(read.known(record::SEGMENTS)?),
        };
        let any_segments = match &segments {
            Segments::Numbers(list) => !list.is_empty(),
            Segments::Objects(tuples) => tuples.is_truthy()?,
        };
        if any_segments {
            let base = PyTuple::new(py, [read.known(record::MODEL)?, read.known(record::ENGINE_KIND)?,
                                         read.known(record::SERVICE_NAME)?])?;
            let cache_key = base.add(&dimensions)?;
            let by_name = match self.segment_cache.bind(py).get_item(&cache_key)? {
                Some(found) => found,
                None => self.segment_entry.bind(py).call1((&cache_key,))?,
            }.downcast_into::<PyDict>()?;
            let everything = by_name.get_item(pyo3::intern!(py, ""))?;
            if everything.is_some() && !too_long.is_truthy()? {
                too_long = match self.segment_too_long.bind(py).get_item(&cache_key)? {
                    Some(label) => label,
                    None => pyo3::intern!(py, "dimension").clone().into_any(),
                };
            }
            let resolve = self.resolve_segment.bind(py);
            let resolve = |name: &Bound<'py, PyAny>| resolve.call1((&by_name, &base, &dimensions, name));
            let now = if with_exemplars { Some(now) } else { None };
            match &segments {
                Segments::Numbers(list) => self.segments.observe_native(py, list, &by_name, everything.as_ref(), resolve,
                                                                        weight, &trace_id, &span_id, now)?,
                Segments::Objects(tuples) => self.segments.observe(py, tuples, &by_name, everything.as_ref(), resolve,
                                                                   weight, &trace_id, &span_id, now)?,
            }
        }
        if too_long.is_truthy()? {
            let counts = self.too_long.bind(py);
            let count: i64 = match counts.get_item(&too_long)? {
                Some(count) => count.extract()?,
                None => 0,
            };
            counts.set_item(too_long, count + 1)?;
        }
        Ok(())
    }

    /// `record` of each (record, with exemplars), in order, in one call; stops at the first that
    /// raises, as a loop of `record` calls does.
    fn record_many<'py>(&mut self, py: Python<'py>, recording: &Bound<'py, PyList>) -> PyResult<()> {
        for item in recording.iter() {
            let pair = item.downcast_into::<PyTuple>()?;
            let with_exemplars: bool = pair.get_item(1)?.extract()?;
            self.record(py, &pair.get_item(0)?, with_exemplars)?;
        }
        Ok(())
    }
}

/// A Python int as i128: through i64 first (PyO3's i128 conversion under the stable ABI goes
/// through byte arrays, ~100 ns; a segment time fits an i64 until 2262).
pub(crate) fn wide_int(value: &Bound<'_, PyAny>) -> PyResult<i128> {
    match value.extract::<i64>() {
        Ok(number) => Ok(i128::from(number)),
        Err(_) => value.extract::<i128>(),
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Series>()?;
    module.add_class::<CounterSeries>()?;
    module.add_class::<Observer>()?;
    module.add_class::<Recording>()?;
    Ok(())
}
