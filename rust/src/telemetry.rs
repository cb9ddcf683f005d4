//! A self-telemetry counter's value without a lock (`service/telemetry.py` `incrementer`): what
//! `prometheus_client.values.MutexValue` holds (a float and an exemplar), with the same methods.
//! Its methods run while their caller holds the GIL and release it nowhere, so an increment cannot
//! interleave with another; the per-trace chain increments three counters per trace, and the
//! mutex's acquire and release in Python cost ~0.13 µs each time.

use pyo3::prelude::*;

#[pyclass(module = "otel_llm._core")]
pub struct CounterValue {
    value: f64,
    exemplar: Option<PyObject>,
}

#[pymethods]
impl CounterValue {
    #[new]
    #[pyo3(signature = (value = 0.0, exemplar = None))]
    fn new(value: f64, exemplar: Option<PyObject>) -> Self {
        CounterValue { value, exemplar }
    }

    /// `value += amount`, the float addition `MutexValue.inc` does.
    fn inc(&mut self, amount: f64) {
        self.value += amount;
    }

    #[pyo3(signature = (value, timestamp = None))]
    fn set(&mut self, value: f64, timestamp: Option<PyObject>) {
        let _ = timestamp; // MutexValue takes it and ignores it too
        self.value = value;
    }

    fn get(&self) -> f64 {
        self.value
    }

    #[pyo3(signature = (exemplar))]
    fn set_exemplar(&mut self, exemplar: Option<PyObject>) {
        self.exemplar = exemplar;
    }

    fn get_exemplar(&self, py: Python<'_>) -> Option<PyObject> {
        self.exemplar.as_ref().map(|exemplar| exemplar.clone_ref(py))
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.exemplar)
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<CounterValue>()
}
