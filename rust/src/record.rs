//! The request record the core builds (`records.rs`): `pdata.records.RequestRecord`'s fields, in its
//! order, held as the objects Python's record would hold, behind the same attribute names. Python
//! reads it as it reads its own dataclass; the core's recorder and decider read a field by its
//! index instead of by name (`RecordRef`), which is what this class is for: a dataclass record
//! costs its generated `__init__` to make (~0.4 µs) and an attribute lookup per field read (~50 per
//! record in the recorder alone). It is immutable: nothing changes a record once it is built.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyString, PyTuple};

/// `i` where `FIELDS[i] == name`, at compile time (a getter for a field that is not one fails the build).
const fn index_of(name: &str) -> usize {
    let wanted = name.as_bytes();
    let mut index = 0;
    while index < FIELDS.len() {
        let field = FIELDS[index].as_bytes();
        if field.len() == wanted.len() {
            let mut at = 0;
            while at < field.len() && field[at] == wanted[at] {
                at += 1;
            }
            if at == field.len() {
                return index;
            }
        }
        index += 1;
    }
    panic!("not a RequestRecord field")
}

macro_rules! request_record {
    ($($name:ident),* $(,)?) => {
        /// `RequestRecord`'s fields in declaration order (`pdata/records.py`; Python checks that the two agree).
        pub const FIELDS: &[&str] = &[$(stringify!($name)),*];
        pub const FIELD_COUNT: usize = FIELDS.len();

        #[pymethods]
        impl RequestRecord {
            $(
                #[getter]
                fn $name(&self, py: Python<'_>) -> PyResult<PyObject> {
                    const INDEX: usize = index_of(stringify!($name));
                    self.field(py, INDEX)
                }
            )*

            /// Every field's value, positionally (what tests use to make one from a Python record).
            #[new]
            #[pyo3(signature = (*values))]
            fn py_new(values: &Bound<'_, PyTuple>) -> PyResult<Self> {
                let given = values.len();
                let fields: Vec<PyObject> = values.iter().map(|value| value.unbind()).collect();
                let fields: [PyObject; FIELD_COUNT] = fields.try_into().map_err(|_| {
                    PyValueError::new_err(format!("RequestRecord takes its {FIELD_COUNT} fields, {given} given"))
                })?;
                Ok(RequestRecord::new(fields))
            }

            #[classattr]
            #[pyo3(name = "FIELDS")]
            fn field_names() -> Vec<&'static str> {
                FIELDS.to_vec()
            }

            /// `RequestRecord.succeeded`: the outcome is not one of `Outcome.FAILED`.
            #[getter]
            fn succeeded(&self, py: Python<'_>) -> PyResult<bool> {
                let failed = FAILED.get_or_try_init(py, || -> PyResult<PyObject> {
                    Ok(py.import("otel_llm.pdata.records")?.getattr("Outcome")?.getattr("FAILED")?.unbind())
                })?;
                Ok(!failed.bind(py).contains(self.field(py, OUTCOME)?)?)
            }

            /// The dataclass's equality: the same fields, equal in order, with this class or Python's
            /// `RequestRecord` (so a record of either path compares with one of the other).
            fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
                let mine = self.field_tuple(py)?;
                let theirs = if let Ok(native) = other.downcast::<RequestRecord>() {
                    native.get().field_tuple(py)?
                } else if is_python_record(other)? {
                    let mut values = Vec::with_capacity(FIELD_COUNT);
                    for name in FIELDS {
                        values.push(other.getattr(*name)?);
                    }
                    PyTuple::new(py, values)?
                } else {
                    return Ok(py.NotImplemented());
                };
                Ok(mine.eq(theirs)?.into_pyobject(py)?.to_owned().into_any().unbind())
            }

            /// As a dataclass's repr: `RequestRecord(trace_id=b'...', ...)`.
            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let mut text = String::from("RequestRecord(");
                for (index, name) in FIELDS.iter().enumerate() {
                    if index > 0 {
                        text.push_str(", ");
                    }
                    text.push_str(name);
                    text.push('=');
                    text.push_str(self.field(py, index)?.bind(py).repr()?.to_str()?);
                }
                text.push(')');
                Ok(text)
            }

            /// Unhashable, as a mutable dataclass with `eq` is.
            fn __hash__(&self) -> PyResult<isize> {
                Err(PyTypeError::new_err("unhashable type: 'RequestRecord'"))
            }
        }
    };
}

request_record!(
    trace_id, span_id, engine_kind, adapter, service_name, model, model_source, request_model, response_model,
    operation_name, provider_name, outcome, side, operation_source, error_type, server_address, server_port,
    start_unix_ns, ttft_s, tpot_s, e2e_s, queue_s, prefill_s, decode_s, inference_s, prompt_tokens,
    completion_tokens, gateway_overhead_s, client_overhead_s, edge_ttft_s, edge_span_id, joined_span_id, segments,
    dimensions, weight, rejected, segments_missing, not_measurable, segments_derived, cached_tokens,
    cache_write_tokens, reasoning_tokens, itl_s, tenant, spec_accepted_tokens, spec_draft_tokens, spec_steps,
    lora_adapter, lora_base_model,
);

pub const TRACE_ID: usize = index_of("trace_id");
pub const SPAN_ID: usize = index_of("span_id");
pub const ENGINE_KIND: usize = index_of("engine_kind");
pub const SERVICE_NAME: usize = index_of("service_name");
pub const MODEL: usize = index_of("model");
pub const OUTCOME: usize = index_of("outcome");
pub const SIDE: usize = index_of("side");
pub const SEGMENTS: usize = index_of("segments");
pub const DIMENSIONS: usize = index_of("dimensions");
pub const WEIGHT: usize = index_of("weight");
pub const REJECTED: usize = index_of("rejected");
pub const NOT_MEASURABLE: usize = index_of("not_measurable");

static FAILED: GILOnceCell<PyObject> = GILOnceCell::new();
static NAMES: GILOnceCell<Vec<Py<PyString>>> = GILOnceCell::new();

/// `FIELDS` as interned Python strings, made once.
fn field_names(py: Python<'_>) -> PyResult<&Vec<Py<PyString>>> {
    NAMES.get_or_try_init(py, || Ok(FIELDS.iter().map(|name| PyString::intern(py, name).unbind()).collect()))
}

/// An instance of Python's own `RequestRecord` dataclass (found by its fields, not imported).
fn is_python_record(other: &Bound<'_, PyAny>) -> PyResult<bool> {
    let class = other.get_type();
    if class.name()?.to_str()? != "RequestRecord" {
        return Ok(false);
    }
    class.hasattr(pyo3::intern!(other.py(), "__dataclass_fields__"))
}

/// A record's segments as the builder computed them: (name, start, end) in order, and the class
/// `segments` reads them as (`pdata.records.Segment`).
pub struct NativeSegments {
    pub segment_type: PyObject,
    pub list: Box<[(&'static str, i64, i64)]>,
}

#[pyclass(frozen, module = "otel_llm._core", name = "RequestRecord")]
pub struct RequestRecord {
    fields: [PyObject; FIELD_COUNT],
    // Segments held as numbers: the core's recorder reads them so, and only a kept trace's record
    // (or a Python reader) has them made the named tuples `segments` gives, once. Five or six
    // named tuples per request were a fifth of building a record that, for a dropped trace, nothing
    // but the recorder reads.
    native_segments: Option<NativeSegments>,
    segments: GILOnceCell<PyObject>,
}

impl RequestRecord {
    pub fn new(fields: [PyObject; FIELD_COUNT]) -> Self {
        RequestRecord { fields, native_segments: None, segments: GILOnceCell::new() }
    }

    /// `fields[SEGMENTS]` is not read: `segments` are these.
    pub fn with_segments(fields: [PyObject; FIELD_COUNT], segments: NativeSegments) -> Self {
        RequestRecord { fields, native_segments: Some(segments), segments: GILOnceCell::new() }
    }

    /// The field at `index`, as Python reads it.
    pub fn field(&self, py: Python<'_>, index: usize) -> PyResult<PyObject> {
        if index == SEGMENTS {
            if let Some(native) = &self.native_segments {
                let made = self.segments.get_or_try_init(py, || -> PyResult<PyObject> {
                    Ok(crate::segment_tuple(py, native.segment_type.bind(py), &native.list)?.into_any().unbind())
                })?;
                return Ok(made.clone_ref(py));
            }
        }
        Ok(self.fields[index].clone_ref(py))
    }

    /// The segments as numbers, where the builder kept them so.
    pub fn native_segments(&self) -> Option<&[(&'static str, i64, i64)]> {
        self.native_segments.as_ref().map(|native| &native.list[..])
    }

    fn field_tuple<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, (0..FIELD_COUNT).map(|index| self.field(py, index)).collect::<PyResult<Vec<_>>>()?)
    }
}

/// A field name resolved once: its index in the core's record, for reading either kind of record.
pub struct FieldRef {
    pub name: Py<PyString>,
    index: Option<usize>,
}

impl FieldRef {
    pub fn new(name: Py<PyString>, py: Python<'_>) -> Self {
        let index = FIELDS.iter().position(|field| name.bind(py).to_str().is_ok_and(|text| text == *field));
        FieldRef { name, index }
    }
}

/// A record being read: the object, and the core's record behind it when it is one.
pub struct RecordRef<'a, 'py> {
    pub object: &'a Bound<'py, PyAny>,
    native: Option<&'a RequestRecord>,
}

impl<'a, 'py> RecordRef<'a, 'py> {
    pub fn of(object: &'a Bound<'py, PyAny>) -> Self {
        let native = object.downcast::<RequestRecord>().ok().map(|record| record.get());
        RecordRef { object, native }
    }

    /// The field `field` names: by index from the core's record, by attribute from any other.
    #[inline]
    pub fn read(&self, field: &FieldRef) -> PyResult<Bound<'py, PyAny>> {
        let py = self.object.py();
        match (self.native, field.index) {
            (Some(native), Some(index)) => Ok(native.field(py, index)?.into_bound(py)),
            _ => self.object.getattr(field.name.bind(py)),
        }
    }

    /// A field known at compile time (`index`: one of this file's constants).
    #[inline]
    pub fn known(&self, index: usize) -> PyResult<Bound<'py, PyAny>> {
        let py = self.object.py();
        match self.native {
            Some(native) => Ok(native.field(py, index)?.into_bound(py)),
            None => self.object.getattr(field_names(py)?[index].bind(py)),
        }
    }

    /// The core's record's segments as numbers, where it holds them so (`Recording` reads them
    /// without making them Python objects).
    pub fn native_segments(&self) -> Option<&'a [(&'static str, i64, i64)]> {
        self.native.and_then(|native| native.native_segments())
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<RequestRecord>()
}
