//! The completion lane: the completion chain's steps for the traces the core reads whole, in runs,
//! with no Python object per trace but the record: a trace's spans are read as the buffer's pairs
//! (no dict), and its decision is remembered in the buffer as its parts (no `Remembered`).
//!
//! Most completed traces are one request the core builds a record for (`records.rs`), decided by
//! policies the core runs (`quantiles.rs` `Decider`) and dropped. Taken along the chain in Python
//! (`service/lane.py` says which chain) each cost ~2–3 µs of stage loops, objects and lists between
//! the core's per-batch calls in one process, more at saturation (docs/performance.md, stage
//! seventeen). Here a run of such traces is
//! built, decided and recorded by the same code, in the chain's order: every trace of the run
//! decided, then every trace recorded, as the stages do for a batch; the decisions are remembered
//! (`remember`, under the buffer's lock). Python then counts what the stages count and hands the
//! kept traces to the redaction stage; a
//! trace the core does not build a record for is the chain's, as before (`Lane.build` says where
//! each run ends).
//!
//! Decisions and recordings follow the order of the traces across runs, so the decider's windows
//! and the histograms' sums see what the chain would have shown them
//! (`tests/unit/service/test_completion_lane.py`).

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::buffer::{CompletedSpans, TraceBuffer};
use crate::quantiles::Decider;
use crate::record::{self, RecordRef};
use crate::recorder::Recording;
use crate::records::RecordBuilder;

/// A trace the lane takes: its spans, why it completed, its one record and, once decided, the
/// index of the policy that kept it (-1: none did) or what the policies raised.
struct Taken {
    trace: Py<CompletedSpans>,
    reason: PyObject,
    record: PyObject,
    matched: Option<Result<i64, PyErr>>,
}

/// The traces of one run, in completion order, from `Lane.build` to `Lane.finish`.
#[pyclass(module = "otel_llm._core")]
pub struct LaneRun {
    taken: Vec<Taken>,
}

#[pymethods]
impl LaneRun {
    fn __len__(&self) -> usize {
        self.taken.len()
    }
}

/// Counts by key, keys compared as Python objects (nearly always the same interned string).
struct Tally {
    counts: Vec<(PyObject, u64)>,
}

impl Tally {
    fn add(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        for (known, count) in &mut self.counts {
            let known = known.bind(key.py());
            if known.is(key) || known.eq(key)? {
                *count += 1;
                return Ok(());
            }
        }
        self.counts.push((key.clone().unbind(), 1));
        Ok(())
    }

    fn into_list<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for (key, count) in self.counts {
            list.append((key, count))?;
        }
        Ok(list)
    }
}

#[pyclass(frozen, module = "otel_llm._core")]
pub struct Lane {
    builder: Py<RecordBuilder>,
    decider: Py<Decider>,
    recording: Py<Recording>,
    /// `pdata.traces.Remembered`, `DROP`, and the decision of each policy that keeps (in policy order).
    remembered: PyObject,
    drop: PyObject,
    kept: Vec<PyObject>,
    /// Traces completed here (`finish`ed), for tests and benches.
    completed: AtomicU64,
}

impl Lane {
    /// The decision of a trace the policy at `index` kept (`DROP` for -1: none did).
    fn decision(&self, index: i64) -> PyResult<&PyObject> {
        if index < 0 {
            return Ok(&self.drop);
        }
        usize::try_from(index).ok().and_then(|index| self.kept.get(index)).ok_or_else(|| {
            pyo3::exceptions::PyIndexError::new_err(format!("no kept decision for policy {index}"))
        })
    }

    /// `item`'s trace and its record, where `item` is a (core's completed trace, reason) whose
    /// spans the core builds one record of; `None` for any other (the chain's).
    fn take(&self, py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<Option<Taken>> {
        let Ok(pair) = item.downcast::<PyTuple>() else { return Ok(None) };
        if pair.len() != 2 {
            return Ok(None);
        }
        let trace = pair.get_item(0)?;
        let Ok(trace) = trace.downcast_into::<CompletedSpans>() else { return Ok(None) };
        let built = self.builder.get().read(py, &trace.get().span_set(py));
        match built {
            Ok(Ok(record)) => Ok(Some(Taken {
                trace: trace.unbind(),
                reason: pair.get_item(1)?.unbind(),
                record,
                matched: None,
            })),
            // Declined, or a trace whose reading raises: the chain reads it, and raises it there.
            Ok(Err(_)) | Err(_) => Ok(None),
        }
    }
}

#[pymethods]
impl Lane {
    /// `builder`: the metrics stage's `RecordBuilder`; `decider`: the sampler's `Decider` (no rate
    /// limit); `recording`: the recorder's `Recording` (no accounting); `remembered`, `drop`, `kept`:
    /// `Remembered`, `DROP`, and the `Decision` each policy keeps a trace with, in policy order.
    #[new]
    fn new(builder: Py<RecordBuilder>, decider: Py<Decider>, recording: Py<Recording>, remembered: PyObject,
           drop: PyObject, kept: Vec<PyObject>) -> Self {
        Lane { builder, decider, recording, remembered, drop, kept, completed: AtomicU64::new(0) }
    }

    /// Traces completed here so far.
    #[getter]
    fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.builder)?;
        visit.call(&self.decider)?;
        visit.call(&self.recording)?;
        visit.call(&self.remembered)?;
        visit.call(&self.drop)?;
        for decision in &self.kept {
            visit.call(decision)?;
        }
        Ok(())
    }

    /// The run that starts at `chunk[start]` (items `(trace, reason)` in completion order): where it
    /// ends, and the lane's run of it (each trace built into its record), or `None` where the run's
    /// traces are the chain's (the first the lane takes ends it; it is built again in its own run).
    fn build(&self, py: Python<'_>, chunk: &Bound<'_, PyList>, start: usize) -> PyResult<(usize, Option<LaneRun>)> {
        let end = chunk.len();
        let mut taken: Vec<Taken> = Vec::new();
        let mut at = start;
        let mut lane = None;
        while at < end {
            let item = self.take(py, &chunk.get_item(at)?)?;
            let this_lane = item.is_some();
            if *lane.get_or_insert(this_lane) != this_lane {
                break;
            }
            if let Some(item) = item {
                taken.push(item);
            }
            at += 1;
        }
        Ok((at, if lane == Some(true) { Some(LaneRun { taken }) } else { None }))
    }

    /// Every trace of `run` decided, in order (the caller holds the sampler's lock).
    fn decide(&self, py: Python<'_>, run: &Bound<'_, LaneRun>) -> PyResult<()> {
        let decider = self.decider.get();
        let mut run = run.borrow_mut();
        for taken in &mut run.taken {
            let trace = taken.trace.get();
            let records = PyList::new(py, [taken.record.bind(py)])?;
            taken.matched = Some(decider.first_match_in(py, trace.trace_id.bind(py).as_bytes(), &trace.span_set(py),
                                                     records.as_any()));
        }
        Ok(())
    }

    /// The records of `run[start:end]` recorded, in order, with exemplars where their trace is kept
    /// (the caller holds the recorder's lock); raises what recording the first failing one raised.
    fn record(&self, py: Python<'_>, run: &Bound<'_, LaneRun>, start: usize, end: usize) -> PyResult<()> {
        let run = run.borrow();
        let mut recording = self.recording.bind(py).borrow_mut();
        for taken in run.taken.iter().take(end).skip(start) {
            let kept = matches!(taken.matched, Some(Ok(index)) if index >= 0);
            recording.record(py, taken.record.bind(py), kept)?;
        }
        Ok(())
    }

    /// The run's `(trace, reason)`s, in order.
    fn items<'py>(&self, py: Python<'py>, run: &Bound<'py, LaneRun>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for taken in &run.borrow().taken {
            list.append((taken.trace.bind(py), taken.reason.bind(py)))?;
        }
        Ok(list)
    }

    /// The run's decisions into the buffer's decision cache, as `DecisionStage` remembers them
    /// (`Remembered(decision, (span_id,))`, held as their parts); a trace whose policies raised is
    /// not remembered. The caller holds the buffer's lock.
    fn remember(&self, py: Python<'_>, run: &Bound<'_, LaneRun>, buffer: &Bound<'_, TraceBuffer>) -> PyResult<()> {
        let run = run.borrow();
        let mut buffer = buffer.borrow_mut();
        for taken in &run.taken {
            let decision = match &taken.matched {
                None => {
                    let message = "a lane run remembered before it was decided";
                    return Err(pyo3::exceptions::PyRuntimeError::new_err(message));
                }
                Some(Err(_)) => continue,
                Some(Ok(index)) => self.decision(*index)?,
            };
            let span_id = RecordRef::of(taken.record.bind(py)).known(record::SPAN_ID)?.unbind();
            buffer.remember_lane_decision(py, taken.trace.get().trace_id.bind(py).as_bytes(), decision.clone_ref(py),
                                          span_id, &self.remembered)?;
        }
        Ok(())
    }

    /// What the stages do with the decided run besides recording it and remembering its decisions,
    /// for Python to do: `(kept, raised, dropped, assembled, refused, reasons)`: the kept traces as
    /// `(trace, reason, record, decision)`, the traces whose policies raised as `(trace, reason,
    /// record, exception)`, the number dropped, the records by `(engine_kind, outcome)`, the records
    /// with values refused or intervals not measurable, and the traces by completion reason.
    #[allow(clippy::type_complexity)]
    fn finish<'py>(&self, py: Python<'py>, run: &Bound<'py, LaneRun>)
                   -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, u64, Bound<'py, PyList>, Bound<'py, PyList>,
                                Bound<'py, PyList>)> {
        let run = run.borrow();
        self.completed.fetch_add(run.taken.len() as u64, Ordering::Relaxed);
        let kept = PyList::empty(py);
        let raised = PyList::empty(py);
        let refused = PyList::empty(py);
        let mut dropped = 0u64;
        let mut assembled = Tally { counts: Vec::new() };
        let mut reasons = Tally { counts: Vec::new() };
        for taken in &run.taken {
            let trace = taken.trace.bind(py);
            let reason = taken.reason.bind(py);
            let record = taken.record.bind(py);
            let read = RecordRef::of(record);
            reasons.add(reason)?;
            let kind_and_outcome = PyTuple::new(py, [read.known(record::ENGINE_KIND)?, read.known(record::OUTCOME)?])?;
            assembled.add(kind_and_outcome.as_any())?;
            if read.known(record::REJECTED)?.is_truthy()? || read.known(record::NOT_MEASURABLE)?.is_truthy()? {
                refused.append(record)?;
            }
            match &taken.matched {
                None => {
                    return Err(pyo3::exceptions::PyRuntimeError::new_err("a lane run finished before it was decided"));
                }
                Some(Err(error)) => raised.append((trace, reason, record, error.clone_ref(py).into_value(py)))?,
                Some(Ok(index)) if *index < 0 => dropped += 1,
                Some(Ok(index)) => kept.append((trace, reason, record, self.decision(*index)?))?,
            }
        }
        Ok((kept, raised, dropped, assembled.into_list(py)?, refused, reasons.into_list(py)?))
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Lane>()?;
    module.add_class::<LaneRun>()
}
