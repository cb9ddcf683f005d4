//! The trace buffer's state in the core: `TraceAssembler`'s (`otel_llm/processor/tail_sampling/assembler.py`)
//! pending traces, their readiness, the ready queue, the decision cache and the parked late spans,
//! held in Rust instead of one Python object and one dict per trace.
//!
//! The Python class stays the reference: every method here does what its namesake there does, in
//! the same order. `tests/unit/tail_sampling/test_native_buffer.py` compares the two on seeded random
//! workloads, `tests/test_trace_assembly.py` runs its scenarios on both, and `tests/test_native_core.py`
//! the service end to end. `NativeTraceAssembler` (Python) calls these methods only under its lock,
//! so no two calls overlap even when one of them lets another thread take the GIL (an allocation can
//! run the cyclic collector, and with it a finalizer).
//!
//! A trace becomes a Python object only when it leaves (completed, taken for a hand-over, shed): a
//! `CompletedSpans`, whose `spans` dict (made when first read) the chain reads as it read a
//! `PendingTrace`'s. Keys are SipHash'ed (the standard library's default): trace and span ids come
//! from senders, and a chosen-collision flood must not turn the buffer's lookups linear.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::{Observation, Row};

/// `MAX_ANCESTRY` of `pdata/spans.py`: how many ancestors a readiness walk takes at most.
const MAX_ANCESTRY: u32 = 64;
const SPAN_KIND_CLIENT: i32 = 3;
/// A trace looks its spans up by scanning them up to this many (nearly every trace has 1-4), by a
/// map from then on, so a span's cost does not grow with its trace.
const SCAN_LIMIT: usize = 16;
const NIL: u32 = u32::MAX;

/// A trace id (N = 16) or span id (N = 8). Receivers let only those lengths through, held inline; an
/// id of another length (the pipeline fed directly, as the differential test does) is one all the
/// same, buffered as the Python path buffers it, behind a pointer so the common case stays small.
#[derive(Clone, PartialEq, Eq)]
enum Id<const N: usize> {
    Inline([u8; N]),
    Other(Box<Vec<u8>>),
}

impl<const N: usize> Id<N> {
    fn new(bytes: &[u8]) -> Self {
        match <[u8; N]>::try_from(bytes) {
            Ok(inline) => Id::Inline(inline),
            Err(_) => Id::Other(Box::new(bytes.to_vec())),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Id::Inline(inline) => inline,
            Id::Other(bytes) => bytes,
        }
    }
}

impl<const N: usize> std::hash::Hash for Id<N> {
    /// The id's bytes in one write (a derived hash writes the variant and the bytes apart: SipHash
    /// was a tenth of the buffer's time at saturation).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
    }
}

type TraceKey = Id<16>;
type SpanKey = Id<8>;

struct Slot {
    id: SpanKey,
    parent: Option<SpanKey>,
    kind: i32,
    is_engine: bool,
    span: Py<PyAny>,
    span_id: Py<PyBytes>, // the span's own id object: the materialized dict's key, as Python keys it
}

/// Engine spans whose ancestor walk stopped at a missing span, by that span's id, with how many
/// ancestors were found below it (`PendingTrace.add_waiter`).
enum Waiters {
    None,
    One(SpanKey, u32),
    Many(Box<HashMap<SpanKey, Vec<u32>>>),
}

struct Trace {
    first_seen: f64,
    batch: u64, // the last `add_batch` that gave it a span (its readiness is looked at once per call),
    touched_at: u32, // and its place in that call's list of traces given one
    spans: Vec<Slot>,
    index: Option<Box<HashMap<SpanKey, u32>>>,
    has_engine_span: bool,
    ready_at: f64,
    ready_token: u64, // the token its ready-queue entry carries; 0: not ready
    waiters: Waiters,
    unrooted: u32,
    engine_seen_at: f64,
}

impl Trace {
    fn new(first_seen: f64) -> Self {
        Trace { first_seen, batch: 0, touched_at: 0, spans: Vec::new(), index: None, has_engine_span: false,
                ready_at: 0.0, ready_token: 0, waiters: Waiters::None, unrooted: 0, engine_seen_at: 0.0 }
    }

    /// The span with this id; `steps` counts what the lookup looked at (a test's measure of cost).
    fn find(&self, id: &SpanKey, steps: &mut u64) -> Option<usize> {
        match &self.index {
            Some(index) => {
                *steps += 1;
                index.get(id).map(|at| *at as usize)
            }
            None => {
                let found = self.spans.iter().position(|slot| slot.id == *id);
                *steps += found.map_or(self.spans.len(), |at| at + 1) as u64;
                found
            }
        }
    }

    fn ready(&self) -> Option<f64> {
        (self.ready_token != 0).then_some(self.ready_at)
    }

    fn push(&mut self, slot: Slot) {
        let at = self.spans.len() as u32;
        if self.spans.len() == self.spans.capacity() {
            // One slot at a time while small (most traces hold 1-4 spans; a Vec's first growth is
            // to 4), doubling after.
            self.spans.reserve_exact(if self.spans.len() < 4 { 1 } else { self.spans.len() });
        }
        if let Some(index) = &mut self.index {
            index.insert(slot.id.clone(), at);
        } else if self.spans.len() >= SCAN_LIMIT {
            let mut index: HashMap<SpanKey, u32> =
                self.spans.iter().enumerate().map(|(i, s)| (s.id.clone(), i as u32)).collect();
            index.insert(slot.id.clone(), at);
            self.index = Some(Box::new(index));
        }
        self.spans.push(slot);
    }

    fn add_waiter(&mut self, missing: SpanKey, found: u32) {
        match &mut self.waiters {
            Waiters::None => self.waiters = Waiters::One(missing, found),
            Waiters::One(key, first) => {
                let mut many: HashMap<SpanKey, Vec<u32>> = HashMap::new();
                many.insert(key.clone(), vec![*first]);
                many.entry(missing).or_default().push(found);
                self.waiters = Waiters::Many(Box::new(many));
            }
            Waiters::Many(many) => many.entry(missing).or_default().push(found),
        }
    }

    fn pop_waiters(&mut self, arrived: &SpanKey) -> Option<Vec<u32>> {
        match &mut self.waiters {
            Waiters::None => None,
            Waiters::One(key, found) => {
                if key != arrived {
                    return None;
                }
                let found = *found;
                self.waiters = Waiters::None;
                Some(vec![found])
            }
            Waiters::Many(many) => many.remove(arrived),
        }
    }

    /// `TraceAssembler._walk`: continue an engine span's ancestor walk from the span at `top`, its
    /// `found`-th buffered ancestor.
    fn walk(&mut self, top: usize, mut found: u32, steps: &mut u64) {
        let mut parent = self.spans[top].parent.clone();
        while let Some(id) = parent {
            if found >= MAX_ANCESTRY {
                return; // never rooted: too deep, or a cycle
            }
            match self.find(&id, steps) {
                Some(at) => {
                    parent = self.spans[at].parent.clone();
                    found += 1;
                }
                None => {
                    self.add_waiter(id, found);
                    return;
                }
            }
        }
        self.unrooted -= 1;
    }

    /// `_call_in_flight`: the first CLIENT span whose parent is not here.
    fn call_in_flight(&self, steps: &mut u64) -> Option<usize> {
        self.spans.iter().position(|slot| {
            slot.kind == SPAN_KIND_CLIENT
                && slot.parent.as_ref().is_some_and(|parent| self.find(parent, steps).is_none())
        })
    }
}

struct Node {
    key: TraceKey,
    prev: u32,
    next: u32,
    trace: Option<Box<Trace>>, // None: a free slot (boxed: a slab grown by doubling holds ~half free slots)
}

/// The pending traces in the order they came (an `OrderedDict`'s operations: append, remove any,
/// pop the first, move one to the end), in a slab of nodes linked both ways.
#[derive(Default)]
struct Pending {
    nodes: Vec<Node>,
    free: Vec<u32>,
    index: HashMap<TraceKey, u32>,
    head: u32,
    tail: u32,
}

impl Pending {
    fn new() -> Self {
        Pending { head: NIL, tail: NIL, ..Default::default() }
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn get(&self, key: &TraceKey) -> Option<u32> {
        self.index.get(key).copied()
    }

    fn trace(&self, at: u32) -> &Trace {
        self.nodes[at as usize].trace.as_ref().expect("a linked node holds a trace")
    }

    fn trace_mut(&mut self, at: u32) -> &mut Trace {
        self.nodes[at as usize].trace.as_mut().expect("a linked node holds a trace")
    }

    fn link_last(&mut self, at: u32) {
        self.nodes[at as usize].prev = self.tail;
        self.nodes[at as usize].next = NIL;
        if self.tail == NIL {
            self.head = at;
        } else {
            self.nodes[self.tail as usize].next = at;
        }
        self.tail = at;
    }

    fn unlink(&mut self, at: u32) {
        let (prev, next) = (self.nodes[at as usize].prev, self.nodes[at as usize].next);
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn insert(&mut self, key: TraceKey, trace: Box<Trace>) -> u32 {
        let node = Node { key: key.clone(), prev: NIL, next: NIL, trace: Some(trace) };
        let at = match self.free.pop() {
            Some(at) => {
                self.nodes[at as usize] = node;
                at
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.insert(key, at);
        self.link_last(at);
        at
    }

    fn remove(&mut self, at: u32) -> (TraceKey, Box<Trace>) {
        self.unlink(at);
        let node = &mut self.nodes[at as usize];
        let trace = node.trace.take().expect("a linked node holds a trace");
        let key = node.key.clone();
        self.index.remove(&key);
        self.free.push(at);
        if self.index.is_empty() {
            // Nothing pending: the slab's memory goes back too (a burst does not pin its peak).
            self.nodes = Vec::new();
            self.free = Vec::new();
        }
        (key, trace)
    }

    fn move_to_end(&mut self, at: u32) {
        if self.tail != at {
            self.unlink(at);
            self.link_last(at);
        }
    }

    fn order(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len());
        let mut at = self.head;
        while at != NIL {
            out.push(at);
            at = self.nodes[at as usize].next;
        }
        out
    }
}

enum Decided {
    Taken(u64),         // completed, not decided yet: the spans taken so far
    Remembered(PyObject), // its `Remembered`
    // Decided in the completion lane: `Remembered(decision, (span_id,), taken)`, made an object
    // only if something reads it (a late span, a hand-over); nearly none is read before it is forgotten.
    Lane { decision: PyObject, span_id: PyObject, taken: u64 },
}

/// `decided` as its `Remembered` object from now on (a lane's decision made one; `class`: `Remembered`).
fn as_object(py: Python<'_>, decided: &mut Decided, class: Option<&PyObject>) -> PyResult<()> {
    if let Decided::Lane { decision, span_id, taken } = decided {
        let class = class.ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("a lane's decision without its class")
        })?;
        let measured = PyTuple::new(py, [span_id.bind(py)])?;
        let object = class.bind(py).call1((decision.bind(py), measured, *taken))?.unbind();
        *decided = Decided::Remembered(object);
    }
    Ok(())
}

/// One span's fields the buffer reads, from the core's `BufferedSpan` or the dataclass.
struct Read {
    trace_id: TraceKey,
    id: SpanKey,
    parent: Option<SpanKey>,
    kind: i32,
    is_engine: bool,
    span_id: Py<PyBytes>,
}

fn read_span(py: Python<'_>, span: &Bound<'_, PyAny>) -> PyResult<Read> {
    if let Ok(row) = span.downcast::<Row>() {
        let row = row.get();
        return Ok(Read {
            trace_id: Id::new(&row.trace_id),
            id: Id::new(row.span_id.bind(py).as_bytes()),
            parent: row.has_parent.then(|| Id::new(&row.parent_span_id)),
            kind: row.kind,
            is_engine: row.is_engine(py)?,
            span_id: row.span_id.clone_ref(py),
        });
    }
    let trace_id = span.getattr(intern!(py, "trace_id"))?;
    let span_id = span.getattr(intern!(py, "span_id"))?.downcast_into::<PyBytes>()?;
    let parent = span.getattr(intern!(py, "parent_span_id"))?;
    let parent = parent.downcast::<PyBytes>()?.as_bytes();
    let observation = span.getattr(intern!(py, "observation"))?;
    // `BufferedSpan.is_engine`, read through the observation's members (the property is Python code).
    let is_engine = if observation.is_none() {
        false
    } else if let Ok(native) = observation.downcast::<Observation>() {
        let native = native.get();
        !native.may_be_gateway.bind(py).is_truthy()? && !native.part.bind(py).is_truthy()?
    } else {
        !observation.getattr(intern!(py, "may_be_gateway"))?.is_truthy()?
            && !observation.getattr(intern!(py, "part"))?.is_truthy()?
    };
    Ok(Read {
        trace_id: Id::new(trace_id.downcast::<PyBytes>()?.as_bytes()),
        id: Id::new(span_id.as_bytes()),
        parent: (!parent.is_empty()).then(|| Id::new(parent)),
        kind: span.getattr(intern!(py, "kind"))?.extract()?,
        is_engine,
        span_id: span_id.unbind(),
    })
}

/// A trace that left the buffer (completed, or taken for a hand-over): the members of the Python
/// path's `PendingTrace` the chain reads, and its `ancestors`, made in one allocation where a
/// dataclass's eleven slots set from here cost ~0.5 µs more per trace. Its waiters are not kept:
/// nothing after the buffer reads them. Its spans are (id, span) pairs in the buffer's order, made
/// the `spans` dict when Python first reads it: the completion lane reads the pairs (`SpanSet`),
/// and nearly every trace it completes is dropped without a dict ever made.
#[pyclass(frozen, module = "otel_llm._core", name = "CompletedSpans")]
pub struct CompletedSpans {
    #[pyo3(get)]
    pub(crate) trace_id: Py<PyBytes>,
    #[pyo3(get)]
    first_seen: f64,
    slots: Vec<(Py<PyBytes>, PyObject)>,
    spans: GILOnceCell<Py<PyDict>>,
    #[pyo3(get)]
    has_engine_span: bool,
    #[pyo3(get)]
    ready_at: Option<f64>,
    #[pyo3(get)]
    unrooted: u32,
    #[pyo3(get)]
    engine_seen_at: f64,
}

impl CompletedSpans {
    /// The `spans` dict, made once: span id -> span, in the buffer's order (ids are unique in a trace).
    fn dict<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyDict>> {
        let made = self.spans.get_or_try_init(py, || -> PyResult<Py<PyDict>> {
            let spans = PyDict::new(py);
            for (span_id, span) in &self.slots {
                spans.set_item(span_id, span)?;
            }
            Ok(spans.unbind())
        })?;
        Ok(made.bind(py))
    }

    /// The spans as the record builder and the decider read them: the dict once Python has it
    /// (what it reads is what they read), else the pairs.
    pub(crate) fn span_set<'a, 'py>(&'a self, py: Python<'py>) -> SpanSet<'a, 'py> {
        match self.spans.get(py) {
            Some(spans) => SpanSet::Dict(spans.bind(py).clone()),
            None => SpanSet::Slots(py, &self.slots),
        }
    }
}

/// A completed trace's spans as the core reads them: a dict of span id -> span (a Python
/// `PendingTrace`'s, or a `CompletedSpans`' once made), or a `CompletedSpans`' pairs in that order.
pub enum SpanSet<'a, 'py> {
    Dict(Bound<'py, PyDict>),
    Slots(Python<'py>, &'a [(Py<PyBytes>, PyObject)]),
}

/// `SpanSet::values`: the spans in order.
pub enum SpanValues<'a, 'py> {
    Dict(pyo3::types::iter::BoundListIterator<'py>),
    Slots(Python<'py>, std::slice::Iter<'a, (Py<PyBytes>, PyObject)>),
}

impl<'py> Iterator for SpanValues<'_, 'py> {
    type Item = Bound<'py, PyAny>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            SpanValues::Dict(values) => values.next(),
            SpanValues::Slots(py, slots) => slots.next().map(|(_, span)| span.bind(*py).clone()),
        }
    }
}

impl<'a, 'py> SpanSet<'a, 'py> {
    pub fn len(&self) -> usize {
        match self {
            SpanSet::Dict(spans) => spans.len(),
            SpanSet::Slots(_, slots) => slots.len(),
        }
    }

    pub fn values(&self) -> SpanValues<'a, 'py> {
        match self {
            SpanSet::Dict(spans) => SpanValues::Dict(spans.values().into_iter()),
            SpanSet::Slots(py, slots) => SpanValues::Slots(*py, slots.iter()),
        }
    }

    /// A span with this id is in the trace.
    pub fn contains_id(&self, span_id: &[u8]) -> PyResult<bool> {
        match self {
            SpanSet::Dict(spans) => spans.contains(PyBytes::new(spans.py(), span_id)),
            SpanSet::Slots(py, slots) => Ok(slots.iter().any(|(id, _)| id.bind(*py).as_bytes() == span_id)),
        }
    }
}

#[pymethods]
impl CompletedSpans {
    /// `PendingTrace.ancestors`: buffered ancestors of `span`, nearest first, up to the first one not here.
    fn ancestors<'py>(&self, py: Python<'py>, span: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let chain = PyList::empty(py);
        let spans = self.dict(py)?;
        let parent_key = intern!(py, "parent_span_id");
        let mut parent = span.getattr(parent_key)?;
        let mut seen = 0;
        while parent.is_truthy()? && seen < MAX_ANCESTRY {
            let Some(buffered) = spans.get_item(&parent)? else { break };
            parent = buffered.getattr(parent_key)?;
            chain.append(buffered)?;
            seen += 1;
        }
        Ok(chain)
    }

    /// `PendingTrace.spans`: span id -> span.
    #[getter]
    fn spans(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        Ok(self.dict(py)?.clone().unbind())
    }

    /// `PendingTrace.is_rooted`.
    fn is_rooted(&self, py: Python<'_>, span: &Bound<'_, PyAny>) -> PyResult<bool> {
        let chain = self.ancestors(py, span)?;
        let top = if chain.is_empty() { span.clone() } else { chain.get_item(chain.len() - 1)? };
        Ok(!top.getattr(intern!(py, "parent_span_id"))?.is_truthy()?)
    }
}

/// A trace held past `decision_wait` for a call in flight: when it was first seen, its sender (the
/// service.name of its CLIENT span in flight) and its place in the order traces were first held.
struct Held {
    first_seen: f64,
    sender: String,
    place: u64,
}

#[pyclass(module = "otel_llm._core")]
pub struct TraceBuffer {
    grace_s: f64,
    decision_wait_s: f64,
    max_open_call_wait_s: f64,
    max_open_calls_per_sender: usize, // 0: no bound of their own
    max_traces: usize,
    max_spans_per_trace: u64,
    decided_cache_size: usize,
    pending: Pending,
    ready: VecDeque<(TraceKey, f64, u64)>,
    tokens: u64,
    decided: HashMap<TraceKey, Decided>,
    decided_order: VecDeque<TraceKey>,
    parked: HashMap<TraceKey, Vec<PyObject>>,
    // `_held` and `_held_by_sender`: ordered by place (an `OrderedDict`'s order: first held first).
    held: HashMap<TraceKey, Held>,
    held_order: BTreeMap<u64, TraceKey>,
    held_by_sender: HashMap<String, BTreeMap<u64, TraceKey>>,
    holds: u64, // places given so far
    batches: u64,
    lookup_steps: u64, // spans looked at to find one by id, over the buffer's life
    remembered_class: Option<PyObject>, // `Remembered`, given with the completion lane's first decisions
}

impl TraceBuffer {
    /// The pending trace at `at` as a `PendingTrace`, a copy: the trace stays pending.
    fn copy_of(&self, py: Python<'_>, at: u32) -> PyResult<PyObject> {
        let key = self.pending.nodes[at as usize].key.clone();
        let trace = self.pending.trace(at);
        let copy = Box::new(Trace {
            first_seen: trace.first_seen,
            spans: trace.spans.iter().map(|slot| Slot {
                id: slot.id.clone(), parent: slot.parent.clone(), kind: slot.kind, is_engine: slot.is_engine,
                span: slot.span.clone_ref(py), span_id: slot.span_id.clone_ref(py),
            }).collect(),
            batch: 0, touched_at: 0, index: None, has_engine_span: trace.has_engine_span, ready_at: trace.ready_at,
            ready_token: trace.ready_token, waiters: Waiters::None, unrooted: trace.unrooted,
            engine_seen_at: trace.engine_seen_at,
        });
        self.materialize(py, &key, copy)
    }

    /// The trace as it leaves: a `CompletedTrace`'s `trace`, what the Python path's `PendingTrace`
    /// gives the chain (its spans by id, in the order they came; `ancestors`).
    fn materialize(&self, py: Python<'_>, key: &TraceKey, trace: Box<Trace>) -> PyResult<PyObject> {
        let ready_at = trace.ready();
        let slots = trace.spans.into_iter().map(|slot| (slot.span_id, slot.span)).collect();
        let left = CompletedSpans {
            trace_id: PyBytes::new(py, key.as_bytes()).unbind(), first_seen: trace.first_seen, slots,
            spans: GILOnceCell::new(),
            has_engine_span: trace.has_engine_span, ready_at,
            unrooted: trace.unrooted, engine_seen_at: trace.engine_seen_at,
        };
        Ok(Py::new(py, left)?.into_any())
    }

    fn update_readiness(&mut self, at: u32, now: f64) {
        let grace = self.grace_s;
        let trace = self.pending.trace_mut(at);
        if !trace.has_engine_span || trace.unrooted > 0 || trace.ready_token != 0 {
            return;
        }
        self.tokens += 1;
        let ready_at = now + grace;
        trace.ready_at = ready_at;
        trace.ready_token = self.tokens;
        let key = self.pending.nodes[at as usize].key.clone();
        self.ready.push_back((key, ready_at, self.tokens));
    }

    /// `_pop_due`: the ready trace due first, its entry removed, if due at `now` (stale entries dropped).
    fn pop_due(&mut self, now: f64) -> Option<u32> {
        while let Some((key, ready_at, token)) = self.ready.front() {
            let at = self.pending.get(key);
            let current = at.is_some_and(|at| self.pending.trace(at).ready_token == *token);
            if current && *ready_at > now {
                return None;
            }
            self.ready.pop_front();
            if current {
                return at;
            }
        }
        None
    }

    fn remember(&mut self, key: TraceKey, spans: u64) {
        let known = self.decided.len();
        self.decided.insert(key.clone(), Decided::Taken(spans));
        if self.decided.len() != known {
            self.decided_order.push_back(key);
            if known >= self.decided_cache_size {
                self.forget_beyond_cache();
            }
        }
    }

    fn forget_beyond_cache(&mut self) {
        while self.decided.len() > self.decided_cache_size {
            match self.decided_order.pop_front() {
                Some(key) => {
                    self.decided.remove(&key);
                }
                None => break,
            }
        }
    }

    /// Removes the trace at `at` (from the held ones too) and remembers it as completed, undecided.
    fn leave(&mut self, at: u32) -> (TraceKey, Box<Trace>) {
        let (key, trace) = self.pending.remove(at);
        self.unhold(&key);
        self.remember(key.clone(), trace.spans.len() as u64);
        (key, trace)
    }

    /// `_hold`: the trace at `at` held for its call in flight (its span at `in_flight`), if not
    /// already; its sender when that takes the sender past `max_open_calls_per_sender`.
    fn hold(&mut self, py: Python<'_>, at: u32, in_flight: usize) -> PyResult<Option<String>> {
        let key = &self.pending.nodes[at as usize].key;
        if self.held.contains_key(key) {
            return Ok(None);
        }
        let trace = self.pending.trace(at);
        let sender: String = trace.spans[in_flight].span.bind(py).getattr(intern!(py, "service_name"))?.extract()?;
        self.holds += 1;
        let place = self.holds;
        let key = key.clone();
        self.held_order.insert(place, key.clone());
        let of_sender = self.held_by_sender.entry(sender.clone()).or_default();
        of_sender.insert(place, key.clone());
        let over = self.max_open_calls_per_sender > 0 && of_sender.len() > self.max_open_calls_per_sender;
        self.held.insert(key, Held { first_seen: trace.first_seen, sender: sender.clone(), place });
        Ok(over.then_some(sender))
    }

    fn unhold(&mut self, key: &TraceKey) {
        let Some(held) = self.held.remove(key) else { return };
        self.held_order.remove(&held.place);
        if let Some(of_sender) = self.held_by_sender.get_mut(&held.sender) {
            of_sender.remove(&held.place);
            if of_sender.is_empty() {
                self.held_by_sender.remove(&held.sender);
            }
        }
    }

    /// `_past_sender_bound`: the longest-held traces of `senders` past `max_open_calls_per_sender`, completed.
    fn past_sender_bound(&mut self, senders: &[String]) -> Vec<(TraceKey, Box<Trace>)> {
        let mut completed = Vec::new();
        for sender in senders {
            loop {
                let oldest = match self.held_by_sender.get(sender) {
                    Some(of_sender) if of_sender.len() > self.max_open_calls_per_sender => {
                        of_sender.first_key_value().map(|(_, key)| key.clone())
                    }
                    _ => None,
                };
                let Some(at) = oldest.and_then(|key| self.pending.get(&key)) else { break };
                completed.push(self.leave(at));
            }
        }
        completed
    }

    fn pop_oldest(&mut self) -> Option<(TraceKey, Box<Trace>)> {
        let head = self.pending.head;
        (head != NIL).then(|| self.leave(head))
    }

    /// `_make_room`: a due trace; else the one held longest for a call in flight; else the oldest.
    fn make_room(&mut self, now: f64) -> Option<(TraceKey, Box<Trace>, &'static str)> {
        if let Some(at) = self.pop_due(now) {
            let (key, trace) = self.leave(at);
            return Some((key, trace, "ready"));
        }
        let longest_held = self.held_order.first_key_value().and_then(|(_, key)| self.pending.get(key));
        if let Some(at) = longest_held {
            let (key, trace) = self.leave(at);
            return Some((key, trace, "memory_limit"));
        }
        self.pop_oldest().map(|(key, trace)| (key, trace, "memory_limit"))
    }

    /// `remember_decisions` of one trace the completion lane decided: `Remembered(decision,
    /// (span_id,))`, held as its parts (`Decided::Lane`); `remembered`: the class, for the day one is read.
    pub(crate) fn remember_lane_decision(&mut self, py: Python<'_>, trace_id: &[u8], decision: PyObject,
                                         span_id: PyObject, remembered: &PyObject) -> PyResult<()> {
        if self.remembered_class.is_none() {
            self.remembered_class = Some(remembered.clone_ref(py));
        }
        let Some(known) = self.decided.get_mut(&Id::new(trace_id)) else { return Ok(()) };
        let taken = match known {
            Decided::Taken(taken) => *taken,
            Decided::Remembered(previous) => Self::taken_of(py, previous.bind(py))?,
            Decided::Lane { taken, .. } => *taken,
        };
        *known = Decided::Lane { decision, span_id, taken };
        Ok(())
    }

    fn taken_of(py: Python<'_>, remembered: &Bound<'_, PyAny>) -> PyResult<u64> {
        remembered.getattr(intern!(py, "taken"))?.extract()
    }
}

#[pymethods]
impl TraceBuffer {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(grace_s: f64, decision_wait_s: f64, max_open_call_wait_s: f64, max_open_calls_per_sender: usize,
           max_traces: usize, max_spans_per_trace: u64, decided_cache_size: usize) -> Self {
        TraceBuffer {
            grace_s, decision_wait_s, max_open_call_wait_s, max_open_calls_per_sender, max_traces, max_spans_per_trace,
            decided_cache_size, pending: Pending::new(), ready: VecDeque::new(), tokens: 0, decided: HashMap::new(),
            decided_order: VecDeque::new(), parked: HashMap::new(), held: HashMap::new(), held_order: BTreeMap::new(),
            held_by_sender: HashMap::new(), holds: 0, batches: 0, lookup_steps: 0, remembered_class: None,
        }
    }

    fn __len__(&self) -> usize {
        self.pending.len()
    }

    /// `TraceAssembler.add_batch`'s loop: `(completed [(trace, reason)], late [(span, Remembered)],
    /// dropped, duplicate)`.
    fn add_batch<'py>(&mut self, py: Python<'py>, spans: &Bound<'py, PyList>, now: f64)
                      -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, u64, u64)> {
        let completed = PyList::empty(py);
        let late = PyList::empty(py);
        let (mut dropped, mut duplicate) = (0u64, 0u64);
        let limit = self.max_spans_per_trace;
        let measured_key = intern!(py, "measured");
        let taken_key = intern!(py, "taken");
        self.batches += 1;
        let batch = self.batches;
        // The traces given a span, each once, in the order first given one (`touched` in Python);
        // an entry is NIL once its trace has left (`max_traces`) during the call.
        let mut touched: Vec<u32> = Vec::new();
        for span in spans.iter() {
            let Read { trace_id, id, parent, kind, is_engine, span_id } = read_span(py, &span)?;
            let at = match self.pending.get(&trace_id) {
                Some(at) => at,
                None => {
                    if let Some(decided) = self.decided.get_mut(&trace_id) {
                        as_object(py, decided, self.remembered_class.as_ref())?;
                        match decided {
                            Decided::Remembered(remembered) => {
                                let remembered = remembered.bind(py);
                                if is_engine && remembered.getattr(measured_key)?.contains(span_id.bind(py))? {
                                    duplicate += 1; // redelivered (a retried export): measured once already
                                } else {
                                    let taken = Self::taken_of(py, remembered)?;
                                    if taken >= limit {
                                        dropped += 1;
                                    } else {
                                        remembered.setattr(taken_key, taken + 1)?;
                                        late.append((&span, remembered))?;
                                    }
                                }
                            }
                            Decided::Taken(taken) => {
                                if *taken >= limit {
                                    dropped += 1; // its trace is being completed (spans taken so far)
                                } else {
                                    *taken += 1; // it waits for the decision and follows it
                                    self.parked.entry(trace_id.clone()).or_default().push(span.clone().unbind());
                                }
                            }
                            Decided::Lane { .. } => {} // made its object above
                        }
                        continue;
                    }
                    let at = self.pending.insert(trace_id.clone(), Box::new(Trace::new(now)));
                    if self.pending.len() > self.max_traces {
                        if let Some((key, trace, reason)) = self.make_room(now) {
                            if trace.batch == batch {
                                touched[trace.touched_at as usize] = NIL;
                            }
                            if key == trace_id {
                                // Only at max_traces 0, which the config refuses: the Python path
                                // would go on filling the trace it completed; this one counts the span.
                                completed.append((self.materialize(py, &key, trace)?, reason))?;
                                dropped += 1;
                                continue;
                            }
                            completed.append((self.materialize(py, &key, trace)?, reason))?;
                        }
                    }
                    at
                }
            };
            let steps = &mut self.lookup_steps;
            let trace = self.pending.trace_mut(at);
            let previous = trace.find(&id, steps);
            let previous_engine = previous.map(|p| trace.spans[p].is_engine);
            let position = match previous {
                Some(p) if previous_engine == Some(is_engine) => {
                    duplicate += 1; // the same span again (a retried export): it replaces its first copy
                    p
                }
                _ if trace.spans.len() as u64 >= limit => {
                    dropped += 1;
                    continue;
                }
                Some(p) => p,
                None => trace.spans.len(),
            };
            let slot = Slot { id: id.clone(), parent, kind, is_engine, span: span.clone().unbind(), span_id };
            if position == trace.spans.len() {
                trace.push(slot);
            } else {
                trace.spans[position] = slot;
            }
            if is_engine {
                trace.engine_seen_at = now;
                if previous_engine != Some(true) {
                    trace.has_engine_span = true;
                    trace.unrooted += 1;
                    trace.walk(position, 0, steps);
                }
            }
            // A duplicate keeps the readiness its first copy gave.
            if previous.is_none() {
                if let Some(waiters) = trace.pop_waiters(&id) {
                    for found in waiters {
                        trace.walk(position, found + 1, steps);
                    }
                }
            }
            if trace.batch != batch {
                trace.batch = batch;
                trace.touched_at = touched.len() as u32;
                touched.push(at);
            }
        }
        for at in touched {
            if at != NIL {
                self.update_readiness(at, now);
            }
        }
        Ok((completed, late, dropped, duplicate))
    }

    /// `TraceAssembler.tick`'s work under its lock: the traces due at `now`, `[(PendingTrace, reason)]`.
    fn tick<'py>(&mut self, py: Python<'py>, now: f64) -> PyResult<Bound<'py, PyList>> {
        let due = PyList::empty(py);
        if !self.ready.is_empty() {
            while let Some(at) = self.pop_due(now) {
                let (key, trace) = self.pending.remove(at);
                self.unhold(&key);
                let known = self.decided.len(); // `remember`, the cache trimmed once below
                self.decided.insert(key.clone(), Decided::Taken(trace.spans.len() as u64));
                if self.decided.len() != known {
                    self.decided_order.push_back(key.clone());
                }
                due.append((self.materialize(py, &key, trace)?, "ready"))?;
            }
            self.forget_beyond_cache();
        }
        let deadline = now - self.decision_wait_s;
        let open_deadline = now - self.max_open_call_wait_s;
        let holding = self.max_open_call_wait_s > 0.0;
        let mut examined_held = 0usize;
        let mut over_bound: Vec<String> = Vec::new(); // senders taken past max_open_calls_per_sender
        while self.pending.head != NIL {
            let head = self.pending.head;
            let trace = self.pending.trace(head);
            if trace.first_seen > deadline {
                break;
            }
            let in_flight = if holding && (trace.engine_seen_at == 0.0 || trace.engine_seen_at > deadline) {
                trace.call_in_flight(&mut self.lookup_steps)
            } else {
                None
            };
            if let Some(span_at) = in_flight.filter(|_| trace.first_seen > open_deadline) {
                if let Some(sender) = self.hold(py, head, span_at)? {
                    over_bound.push(sender);
                }
                self.pending.move_to_end(head);
                examined_held += 1;
                if examined_held >= self.pending.len() {
                    break;
                }
                continue;
            }
            let (key, trace) = self.leave(head);
            let reason = if in_flight.is_some() { "max_open_call_wait" } else { "decision_wait" };
            due.append((self.materialize(py, &key, trace)?, reason))?;
        }
        for (key, trace) in self.past_sender_bound(&over_bound) {
            due.append((self.materialize(py, &key, trace)?, "open_call_limit"))?;
        }
        Ok(due)
    }

    /// When the longest-due ready entry was due (it may belong to a trace that left otherwise).
    fn first_ready_at(&self) -> Option<f64> {
        self.ready.front().map(|(_, at, _)| *at)
    }

    fn held_since(&self) -> Option<f64> {
        self.held.values().map(|held| held.first_seen).reduce(f64::min)
    }

    /// Spans of the pending traces.
    fn held_spans(&self) -> usize {
        self.pending.order().into_iter().map(|at| self.pending.trace(at).spans.len()).sum()
    }

    /// Spans looked at to find one by id so far: constant per lookup past the scan limit.
    fn lookup_steps(&self) -> u64 {
        self.lookup_steps
    }

    fn held_traces(&self) -> usize {
        self.held.len()
    }

    /// The `count` oldest pending traces, completed (remembered as undecided).
    fn pop_oldest_traces<'py>(&mut self, py: Python<'py>, count: usize) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for _ in 0..count {
            let Some((key, trace)) = self.pop_oldest() else { break };
            out.append(self.materialize(py, &key, trace)?)?;
        }
        Ok(out)
    }

    /// Every pending trace as a `PendingTrace`, oldest first, left in place (`take_pending` picks).
    fn pending_traces<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for at in self.pending.order() {
            out.append(self.copy_of(py, at)?)?;
        }
        Ok(out)
    }

    /// `TraceAssembler.overdue`: copies of the pending traces first seen at or before `seen_before`
    /// and of those among `trace_ids`, left in place (the intake log carries them).
    fn overdue_traces<'py>(&self, py: Python<'py>, seen_before: f64, trace_ids: Vec<Vec<u8>>)
        -> PyResult<Bound<'py, PyList>> {
        let wanted: HashSet<TraceKey> = trace_ids.iter().map(|id| Id::new(id)).collect();
        let out = PyList::empty(py);
        for at in self.pending.order() {
            if self.pending.trace(at).first_seen <= seen_before || wanted.contains(&self.pending.nodes[at as usize].key) {
                out.append(self.copy_of(py, at)?)?;
            }
        }
        Ok(out)
    }

    /// Removes these pending traces, undecided and not remembered (a hand-over takes them).
    fn remove_pending(&mut self, trace_ids: Vec<Vec<u8>>) {
        for trace_id in trace_ids {
            let key = Id::new(&trace_id);
            if let Some(at) = self.pending.get(&key) {
                self.pending.remove(at);
                self.unhold(&key);
            }
        }
    }

    /// `_remember`: completed with `spans` spans, not decided yet.
    fn remember_completed(&mut self, trace_id: &[u8], spans: u64) {
        self.remember(Id::new(trace_id), spans);
    }

    /// The decision cache's decisions, oldest first.
    fn decisions<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for key in &self.decided_order {
            let Some(decided) = self.decided.get_mut(key) else { continue };
            as_object(py, decided, self.remembered_class.as_ref())?;
            if let Decided::Remembered(remembered) = decided {
                out.append((PyBytes::new(py, key.as_bytes()), remembered.bind(py)))?;
            }
        }
        Ok(out)
    }

    fn restore_decisions(&mut self, py: Python<'_>, decisions: Vec<(Vec<u8>, PyObject)>) -> PyResult<()> {
        for (trace_id, remembered) in decisions {
            let key = Id::new(&trace_id);
            let bound = remembered.bind(py);
            let taken = match self.decided.get(&key) {
                None => {
                    self.decided_order.push_back(key.clone());
                    bound.getattr(intern!(py, "measured"))?.len()? as u64
                }
                Some(Decided::Taken(taken)) => *taken,
                Some(Decided::Remembered(known)) => Self::taken_of(py, known.bind(py))?,
                Some(Decided::Lane { taken, .. }) => *taken,
            };
            bound.setattr(intern!(py, "taken"), taken)?;
            self.decided.insert(key, Decided::Remembered(remembered));
            self.forget_beyond_cache();
        }
        Ok(())
    }

    fn remember_decisions(&mut self, py: Python<'_>, decisions: &Bound<'_, PyList>) -> PyResult<()> {
        for item in decisions.iter() {
            let pair = item.downcast::<PyTuple>()?;
            let trace_id = pair.get_item(0)?;
            let key = Id::new(trace_id.downcast::<PyBytes>()?.as_bytes());
            let Some(known) = self.decided.get_mut(&key) else { continue };
            let remembered = pair.get_item(1)?;
            let taken = match known {
                Decided::Taken(taken) => *taken,
                Decided::Remembered(previous) => Self::taken_of(py, previous.bind(py))?,
                Decided::Lane { taken, .. } => *taken,
            };
            remembered.setattr(intern!(py, "taken"), taken)?;
            *known = Decided::Remembered(remembered.unbind());
        }
        Ok(())
    }

    fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// The parked late spans of these traces, each with its trace's decision if remembered.
    fn take_parked<'py>(&mut self, py: Python<'py>, trace_ids: Vec<Vec<u8>>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for trace_id in trace_ids {
            let key = Id::new(&trace_id);
            let Some(spans) = self.parked.remove(&key) else { continue };
            let remembered = match self.decided.get_mut(&key) {
                Some(decided) => {
                    as_object(py, decided, self.remembered_class.as_ref())?;
                    match decided {
                        Decided::Remembered(remembered) => remembered.clone_ref(py),
                        _ => py.None(),
                    }
                }
                None => py.None(),
            };
            for span in spans {
                out.append((span, remembered.bind(py)))?;
            }
        }
        Ok(out)
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<TraceBuffer>()?;
    module.add_class::<CompletedSpans>()?;
    Ok(())
}
