//! The trace buffer: spans grouped by trace until each request can be assembled with its gateway
//! ancestors, and the decision cache late spans follow. A port of
//! `otel_llm/processor/tail_sampling/assembler.py` `TraceAssembler`, the specification: every
//! method here does what its namesake there does, in the same order (with `pdata/spans.py`
//! `PendingTrace` for a trace's readiness and `pdata/traces.py` `Remembered` for a decision).
//!
//! A pending trace is a `model::TraceData` (its spans in its own arena) with its readiness, in a
//! slab linked both ways in the order traces came (the `OrderedDict`'s operations: append, remove
//! any, pop the first, move one to the end). Python hands what leaves to the next stage itself;
//! here every completion (a trace, or one late span) goes to an outbox in the order Python hands
//! them on, and leaves through `tick` or `take_completions`.
//!
//! How the engine drives it, as Python's chain drives `TraceAssembler`:
//! - `add_batch(spans, now)` per request (`add` for one span); its late spans and the traces it
//!   completed to make room wait in the outbox;
//! - `tick_into(now, &mut out)` per tick (`take_completions_into` between ticks): the outbox, then
//!   the traces due;
//! - late spans go along as they come (an `add`'s in one batch, `_hand_on_added`), completed
//!   traces in runs of `COMPLETION_BATCH`; after each run of traces, `remember` the
//!   decision of each trace of it the sampler decided (`remember_decisions`), `add_measured` for
//!   each late engine span measured (Python's stages change the very `Remembered` the cache holds),
//!   then `hand_on_parked(the run's trace ids)` and take what it put in the outbox (`_complete`).
//!
//! Trace and span ids come from senders: every map keyed by them uses the standard library's
//! SipHash-1-3 with per-process random keys, so a chosen-collision flood cannot turn a look-up
//! linear (`IdHasher`, where the alternatives' cost is given). `benches/buffer.rs` measures the
//! buffer's cost per span.

use std::collections::hash_map::{Entry, RandomState};
use std::collections::{HashMap, VecDeque};

use crate::model::{Decision, NewSpan, SpanId, TraceData, TraceId, MAX_ANCESTRY, SPAN_KIND_CLIENT};

/// The hasher of every map keyed by an id a sender chose: SipHash-1-3 with per-process random
/// keys, a keyed PRF, so no sender can aim ids at one bucket. Measured against the alternatives on
/// the buffer's own pattern per trace (insert, three look-ups and a removal among 20 000 pending,
/// an insert and a forget in a 100 000-entry cache; best of 7, interleaved, on a loaded 2-core
/// machine): SipHash-1-3 328 ns, aHash 138 ns, foldhash 116 ns, that is about 50 ns more per span
/// here than aHash. foldhash calls itself minimally DoS-resistant and not for inputs an adversary
/// studies; aHash's resistance has no PRF's analysis behind it. Switching is this one line.
pub type IdHasher = RandomState;

/// `assembler.COMPLETION_BATCH`: traces handed along the chain together. Python hands a trace's
/// parked late spans on after the batch holding it (`_complete`); the engine does the same with
/// `hand_on_parked` after each run of this many completions.
pub const COMPLETION_BATCH: usize = 256;

const NIL: u32 = u32::MAX;

/// `assembler.AssemblySettings`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AssemblySettings {
    pub decision_wait_s: f64,
    pub grace_s: f64,
    /// A trace with a call in flight is held up to this long; 0: off.
    pub max_open_call_wait_s: f64,
    /// Traces one sender (the service.name of the CLIENT span in flight) may have held for a call
    /// in flight; past it its longest-held one is completed (`OpenCallLimit`). 0: no bound of their
    /// own. A count, as Python's `AssemblySettings` has it: the configuration's
    /// `max_open_call_share` of `num_traces` is turned into it by `config.open_calls_per_sender`.
    pub max_open_calls_per_sender: usize,
    pub max_traces: usize,
    pub max_spans_per_trace: u32,
    pub decided_cache_size: usize,
}

impl Default for AssemblySettings {
    fn default() -> Self {
        AssemblySettings {
            decision_wait_s: 10.0,
            grace_s: 1.0,
            max_open_call_wait_s: 0.0,
            max_open_calls_per_sender: 0,
            max_traces: 50_000,
            max_spans_per_trace: 10_000,
            decided_cache_size: 100_000,
        }
    }
}

/// Why a trace left the buffer (`CompletedTrace.reason`): Python's strings, by `as_str`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Every engine span rooted, and the grace after it over (`tick`, `_make_room`).
    Ready,
    /// `decision_wait` after the trace was first seen (`tick`).
    DecisionWait,
    /// Held for a call in flight, `max_open_call_wait` after it was first seen (`tick`).
    MaxOpenCallWait,
    /// The longest-held trace of a sender past `max_open_calls_per_sender` (`tick`, `_past_sender_bound`).
    OpenCallLimit,
    /// Completed early to make room at `max_traces` (`_make_room`).
    MemoryLimit,
    /// Completed early for the memory limiter (`shed`).
    MemoryPressure,
    /// `drain`, and `complete_now`'s default.
    Shutdown,
    /// One span of a trace completed before it came (`_late`).
    Late,
}

impl Reason {
    /// `assembler.COMPLETION_REASONS` in its order, then `Late`.
    pub const ALL: [Reason; 8] = [Reason::Ready, Reason::DecisionWait, Reason::MaxOpenCallWait, Reason::OpenCallLimit,
                                  Reason::MemoryLimit, Reason::MemoryPressure, Reason::Shutdown, Reason::Late];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Ready => "ready",
            Reason::DecisionWait => "decision_wait",
            Reason::MaxOpenCallWait => "max_open_call_wait",
            Reason::OpenCallLimit => "open_call_limit",
            Reason::MemoryLimit => "memory_limit",
            Reason::MemoryPressure => "memory_pressure",
            Reason::Shutdown => "shutdown",
            Reason::Late => "late",
        }
    }

    pub fn parse(text: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|reason| reason.as_str() == text)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The engine spans of a decided trace already measured: nearly always one (`Remembered.measured`,
/// a tuple or a set there). Distinct ids: Python's producers never repeat one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measured(MeasuredIds);

#[derive(Clone, Debug, PartialEq, Eq)]
enum MeasuredIds {
    One(SpanId),
    Many(Box<[SpanId]>),
}

impl Measured {
    pub fn of(span_ids: &[SpanId]) -> Measured {
        match span_ids {
            [one] => Measured(MeasuredIds::One(*one)),
            _ => {
                let mut distinct: Vec<SpanId> = Vec::with_capacity(span_ids.len());
                for id in span_ids {
                    if !distinct.contains(id) {
                        distinct.push(*id);
                    }
                }
                Measured(MeasuredIds::Many(distinct.into_boxed_slice()))
            }
        }
    }

    pub fn as_slice(&self) -> &[SpanId] {
        match &self.0 {
            MeasuredIds::One(one) => std::slice::from_ref(one),
            MeasuredIds::Many(many) => many,
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    pub fn contains(&self, span_id: &SpanId) -> bool {
        self.as_slice().contains(span_id)
    }

    /// `Remembered.add_measured`.
    pub fn insert(&mut self, span_id: SpanId) {
        if !self.contains(&span_id) {
            let mut ids = self.as_slice().to_vec();
            ids.push(span_id);
            self.0 = MeasuredIds::Many(ids.into_boxed_slice());
        }
    }

    fn heap_bytes(&self) -> usize {
        match &self.0 {
            MeasuredIds::One(_) => 0,
            MeasuredIds::Many(many) => many.len() * std::mem::size_of::<SpanId>(),
        }
    }
}

/// `pdata.traces.Remembered`: what the decision cache keeps of a decided trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remembered {
    pub decision: Decision,
    pub measured: Measured,
    /// Spans its trace was completed with plus late spans taken since (set by the cache):
    /// `max_spans_per_trace` holds for late spans too.
    pub taken: u32,
}

impl Remembered {
    pub fn new(decision: Decision, measured: &[SpanId]) -> Remembered {
        Remembered { decision, measured: Measured::of(measured), taken: 0 }
    }
}

/// `pdata.traces.CompletedTrace` as the buffer hands it on: a trace, or one late span of a
/// decided trace alone in its own `TraceData` (`late`, reason `Late`, `_late`).
#[derive(Debug)]
pub struct Completion {
    pub trace: TraceData,
    pub reason: Reason,
    pub late: bool,
    /// The trace's decision, for a late span whose trace's decision is still remembered: a copy as
    /// it was when handed on. Python's is the cache's own object, which the chain's stages then
    /// change (`add_measured`): the engine does that through `TraceBuffer::add_measured`, and
    /// reads `TraceBuffer::remembered` where a later span of the same batch must see it.
    pub prior: Option<Remembered>,
}

/// A span as ingest hands it to the buffer: its trace, the span, and whether it is an engine's own
/// request span (`BufferedSpan.is_engine`, `ShapeInfo::is_engine` of its observation's shape).
pub struct Incoming<'a> {
    pub trace_id: TraceId,
    pub span: NewSpan<'a>,
    pub is_engine: bool,
}

/// What one `add_batch` counted (`_hand_on_added`'s `dropped` and `duplicate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Added {
    pub dropped: u64,
    pub duplicate: u64,
}

// --- a pending trace -------------------------------------------------------------------------------

/// Engine spans whose ancestor walk stopped at a span not (yet) here, by that span's id, with how
/// many ancestors were found below it (`PendingTrace.wait_key`/`waiting`, `add_waiter`). Only the
/// count matters: a resumed walk goes on from the span that arrived.
#[derive(Debug, Default)]
enum Waiters {
    #[default]
    None,
    One(SpanId, u32),
    // Boxed: a trace's slot stays small, and nearly every trace waits for one span at most.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<SpanId, Vec<u32>, IdHasher>>),
}

/// The walks waiting for a span that arrived.
enum Resumed {
    One(u32),
    Many(Vec<u32>),
}

impl Waiters {
    /// `PendingTrace.add_waiter`.
    fn add(&mut self, missing: SpanId, found: u32) {
        match self {
            Waiters::None => *self = Waiters::One(missing, found),
            Waiters::One(key, first) => {
                let mut many: HashMap<SpanId, Vec<u32>, IdHasher> = HashMap::default();
                many.insert(*key, vec![*first]);
                many.entry(missing).or_default().push(found);
                *self = Waiters::Many(Box::new(many));
            }
            Waiters::Many(many) => many.entry(missing).or_default().push(found),
        }
    }

    /// `PendingTrace.pop_waiters`.
    fn pop(&mut self, arrived: &SpanId) -> Option<Resumed> {
        match self {
            Waiters::None => None,
            Waiters::One(key, found) => {
                if key != arrived {
                    return None;
                }
                let found = *found;
                *self = Waiters::None;
                Some(Resumed::One(found))
            }
            Waiters::Many(many) => {
                let popped = many.remove(arrived).map(Resumed::Many);
                if many.is_empty() {
                    *self = Waiters::None; // what it held is freed (Python keeps an empty dict)
                }
                popped
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Waiters::Many(many) => {
                std::mem::size_of::<HashMap<SpanId, Vec<u32>, IdHasher>>()
                    + many.capacity() * (std::mem::size_of::<(SpanId, Vec<u32>)>() + 1)
                    + many.values().map(|v| 4 * v.capacity()).sum::<usize>()
            }
            _ => 0,
        }
    }
}

/// Which of a trace's slots hold an engine span (`BufferedSpan.is_engine` of each): a word inline,
/// more only for a trace of more than 64 spans.
#[derive(Debug, Default)]
struct EngineBits {
    low: u64,
    rest: Box<[u64]>,
}

impl EngineBits {
    fn get(&self, at: usize) -> bool {
        if at < 64 {
            return self.low & (1 << at) != 0;
        }
        self.rest.get(at / 64 - 1).is_some_and(|word| word & (1 << (at % 64)) != 0)
    }

    fn set(&mut self, at: usize, engine: bool) {
        let word = if at < 64 {
            &mut self.low
        } else {
            let index = at / 64 - 1;
            if index >= self.rest.len() {
                // Doubling: a trace's spans grow one by one (rare: past 64 spans).
                let mut grown = vec![0; (index + 1).max(2 * self.rest.len())];
                grown[..self.rest.len()].copy_from_slice(&self.rest);
                self.rest = grown.into_boxed_slice();
            }
            &mut self.rest[index]
        };
        let bit = 1u64 << (at % 64);
        if engine {
            *word |= bit;
        } else {
            *word &= !bit;
        }
    }
}

/// `pdata.spans.PendingTrace`: a trace's spans and its readiness, kept incrementally so a span's
/// cost does not depend on the trace's size.
#[derive(Debug, Default)]
struct Pending {
    data: TraceData,
    first_seen: f64,
    /// When its latest engine span arrived (the caller's clock); 0: none yet.
    engine_seen_at: f64,
    ready_at: f64,
    /// The token its ready-queue entry carries (Python compares the very `ready_at` object); 0: not ready.
    ready_token: u64,
    has_engine_span: bool,
    /// Engine spans not rooted: waiting, or too deep or cyclic ever to be.
    unrooted: u32,
    waiters: Waiters,
    engine: EngineBits,
    /// The last `add_batch` that gave it a span, and its place in that call's `touched`.
    batch: u64,
    touched_at: u32,
    /// Its places among the traces held for a call in flight (`Held`), while it is one of them.
    held: HeldLinks,
}

/// `TraceAssembler._walk`: continue an engine span's ancestor walk from the span at `top`, its
/// `found`-th buffered ancestor (0: itself), as `PendingTrace.is_rooted` walks: rooted, waiting
/// for the first missing ancestor, or never rooted (deeper than `MAX_ANCESTRY`, or a cycle).
fn walk(data: &TraceData, waiters: &mut Waiters, unrooted: &mut u32, top: usize, mut found: usize) {
    let mut parent = data.span(top).parent().copied();
    while let Some(id) = parent {
        if found >= MAX_ANCESTRY {
            return;
        }
        match data.find(&id) {
            Some(at) => {
                parent = data.span(at).parent().copied();
                found += 1;
            }
            None => {
                waiters.add(id, found as u32);
                return;
            }
        }
    }
    // Every walk is started by one engine span's arrival, which counted it unrooted, and ends once.
    debug_assert!(*unrooted > 0);
    *unrooted = unrooted.saturating_sub(1);
}

/// `assembler._call_in_flight`: the first CLIENT span whose parent is not here (its slot): the
/// caller's span (a GenAI client span over its HTTP span, an application span over its call) is
/// still open. Its service.name is the trace's sender while it is held.
fn call_in_flight(data: &TraceData) -> Option<usize> {
    data.spans.iter().position(|span| {
        span.kind == SPAN_KIND_CLIENT && span.parent().is_some_and(|p| data.find(p).is_none())
    })
}

// --- the pending traces in the order they came -------------------------------------------------------

#[derive(Debug)]
struct Node {
    trace_id: TraceId,
    prev: u32,
    next: u32,
    /// A free node's is the default (holding nothing on the heap).
    trace: Pending,
}

/// The pending traces in a slab of nodes linked both ways, oldest first (`TraceAssembler._pending`,
/// an `OrderedDict`).
#[derive(Debug)]
struct Traces {
    nodes: Vec<Node>,
    free: Vec<u32>,
    index: HashMap<TraceId, u32, IdHasher>,
    head: u32,
    tail: u32,
}

impl Traces {
    fn new() -> Traces {
        Traces { nodes: Vec::new(), free: Vec::new(), index: HashMap::default(), head: NIL, tail: NIL }
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn get(&self, trace_id: &TraceId) -> Option<u32> {
        self.index.get(trace_id).copied()
    }

    fn trace(&self, at: u32) -> &Pending {
        &self.nodes[at as usize].trace
    }

    fn trace_mut(&mut self, at: u32) -> &mut Pending {
        &mut self.nodes[at as usize].trace
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

    fn insert(&mut self, trace_id: TraceId, trace: Pending) -> u32 {
        let node = Node { trace_id, prev: NIL, next: NIL, trace };
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
        self.index.insert(trace_id, at);
        self.link_last(at);
        at
    }

    fn remove(&mut self, at: u32) -> (TraceId, Pending) {
        self.unlink(at);
        let node = &mut self.nodes[at as usize];
        let trace = std::mem::take(&mut node.trace);
        let trace_id = node.trace_id;
        self.index.remove(&trace_id);
        self.free.push(at);
        if self.index.is_empty() {
            // Nothing pending: the slab's memory goes back too (a burst does not pin its peak).
            self.nodes = Vec::new();
            self.free = Vec::new();
            self.head = NIL;
            self.tail = NIL;
        }
        (trace_id, trace)
    }

    fn move_to_end(&mut self, at: u32) {
        if self.tail != at {
            self.unlink(at);
            self.link_last(at);
        }
    }

    /// The pending traces' nodes, oldest first.
    fn order(&self) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            (at != NIL).then(|| {
                let this = at;
                at = self.nodes[at as usize].next;
                this
            })
        })
    }
}

/// A held trace's two orders (`HeldLinks`' `prev` and `next` by index): all held traces', and its sender's.
const ALL: usize = 0;
const OF_SENDER: usize = 1;

/// A pending trace's places among the held ones (`Held`): its neighbours in the order all of them
/// were first held and in its sender's (`ALL`, `OF_SENDER`); `sender` is `NIL` while it is not held.
#[derive(Clone, Copy, Debug)]
struct HeldLinks {
    sender: u32,
    prev: [u32; 2],
    next: [u32; 2],
}

impl Default for HeldLinks {
    fn default() -> Self {
        HeldLinks { sender: NIL, prev: [NIL; 2], next: [NIL; 2] }
    }
}

impl HeldLinks {
    fn is_held(&self) -> bool {
        self.sender != NIL
    }
}

/// The first and last held traces of one order.
#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
}

impl Ends {
    const EMPTY: Ends = Ends { head: NIL, tail: NIL };

    /// The trace at `at` linked last in `order`.
    fn push_back(&mut self, traces: &mut Traces, at: u32, order: usize) {
        let links = &mut traces.trace_mut(at).held;
        links.prev[order] = self.tail;
        links.next[order] = NIL;
        if self.tail == NIL {
            self.head = at;
        } else {
            traces.trace_mut(self.tail).held.next[order] = at;
        }
        self.tail = at;
    }

    /// A trace whose links were `links` unlinked from `order`.
    fn unlink(&mut self, traces: &mut Traces, links: &HeldLinks, order: usize) {
        let (prev, next) = (links.prev[order], links.next[order]);
        if prev == NIL {
            self.head = next;
        } else {
            traces.trace_mut(prev).held.next[order] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            traces.trace_mut(next).held.prev[order] = prev;
        }
    }
}

/// One sender's held traces, first held first (`_held_by_sender[sender]`).
#[derive(Debug)]
struct SenderHeld {
    name: Box<str>,
    ends: Ends,
    len: usize,
}

/// The traces held past `decision_wait` for a call in flight (`TraceAssembler._held`: trace id ->
/// (first seen, sender), and `_held_by_sender`, both `OrderedDict`s in the order first held): a
/// subset of the pending traces, each left when its trace leaves. Linked through their
/// `HeldLinks` both ways, all of them and each sender's, so that holding one, letting one go and
/// finding the longest-held (of all, of a sender) take constant time and no allocation but a new
/// sender's name. A held trace's first seen is its trace's `first_seen`.
#[derive(Debug)]
struct Held {
    all: Ends,
    len: usize,
    /// Sender name -> its slot in `senders`. A sender leaves with its last held trace (Python
    /// deletes its entry), so senders (names a sender chose) never outnumber held traces.
    by_name: HashMap<Box<str>, u32, IdHasher>,
    senders: Vec<SenderHeld>,
    free: Vec<u32>,
}

/// Sender slots kept when no trace is held; past it a burst's memory goes back.
const KEPT_SENDER_SLOTS: usize = 64;

impl Held {
    fn new() -> Held {
        Held { all: Ends::EMPTY, len: 0, by_name: HashMap::default(), senders: Vec::new(), free: Vec::new() }
    }

    /// `_hold`: the trace at `at` held for its call in flight (the span at `in_flight`, whose
    /// service.name is the sender), if it is not held already; its sender's name when that takes
    /// the sender past `bound` (0: no bound).
    fn hold(&mut self, traces: &mut Traces, at: u32, in_flight: usize, bound: usize) -> Option<Box<str>> {
        let trace = traces.trace(at);
        if trace.held.is_held() {
            return None;
        }
        let name = trace.data.service_name(in_flight);
        let sender = match self.by_name.get(name) {
            Some(&sender) => sender,
            None => {
                let list = SenderHeld { name: name.into(), ends: Ends::EMPTY, len: 0 };
                let sender = match self.free.pop() {
                    Some(sender) => {
                        self.senders[sender as usize] = list;
                        sender
                    }
                    None => {
                        self.senders.push(list);
                        (self.senders.len() - 1) as u32
                    }
                };
                self.by_name.insert(name.into(), sender);
                sender
            }
        };
        traces.trace_mut(at).held.sender = sender;
        self.all.push_back(traces, at, ALL);
        self.len += 1;
        let list = &mut self.senders[sender as usize];
        list.ends.push_back(traces, at, OF_SENDER);
        list.len += 1;
        (bound > 0 && list.len > bound).then(|| list.name.clone())
    }

    /// `_unhold`, for a trace about to leave (nothing when it is not held).
    fn release(&mut self, traces: &mut Traces, at: u32) {
        let links = std::mem::take(&mut traces.trace_mut(at).held);
        if !links.is_held() {
            return;
        }
        self.all.unlink(traces, &links, ALL);
        self.len -= 1;
        let list = &mut self.senders[links.sender as usize];
        list.ends.unlink(traces, &links, OF_SENDER);
        list.len -= 1;
        if list.len == 0 {
            self.by_name.remove(&std::mem::take(&mut list.name));
            self.free.push(links.sender);
        }
        if self.len == 0 {
            if self.senders.capacity() > KEPT_SENDER_SLOTS {
                *self = Held::new();
            } else {
                self.senders.clear();
                self.free.clear();
            }
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The trace held longest (`next(iter(_held))`).
    fn first(&self) -> Option<u32> {
        (self.all.head != NIL).then_some(self.all.head)
    }

    /// The longest-held trace of sender `name` while it has more than `bound` held (`_past_sender_bound`'s test).
    fn first_past_bound(&self, name: &str, bound: usize) -> Option<u32> {
        let list = &self.senders[*self.by_name.get(name)? as usize];
        (list.len > bound).then_some(list.ends.head)
    }

    /// The held traces, first held first.
    fn order<'a>(&self, traces: &'a Traces) -> impl Iterator<Item = u32> + 'a {
        let mut at = self.all.head;
        std::iter::from_fn(move || {
            (at != NIL).then(|| {
                let this = at;
                at = traces.trace(at).held.next[ALL];
                this
            })
        })
    }

    /// `held_since`: the earliest first seen of the held traces (Python's `min` over them in the
    /// order they were held: a later one replaces the least so far only when less than it).
    fn since(&self, traces: &Traces) -> Option<f64> {
        self.order(traces).map(|at| traces.trace(at).first_seen).reduce(|a, b| if b < a { b } else { a })
    }

    fn heap_bytes(&self) -> usize {
        self.by_name.capacity() * (std::mem::size_of::<(Box<str>, u32)>() + 1)
            + self.senders.capacity() * std::mem::size_of::<SenderHeld>()
            + self.senders.iter().map(|list| 2 * list.name.len()).sum::<usize>()
            + self.free.capacity() * 4
    }
}

// --- the decision cache ------------------------------------------------------------------------------

/// A trace completed here: the spans it was completed with plus late spans taken since, until the
/// chain's decision replaces that count (`TraceAssembler._decided`'s `Remembered | int`).
#[derive(Clone, Debug)]
enum Decided {
    Completing(u32),
    Decided(Remembered),
}

impl Decided {
    fn taken(&self) -> u32 {
        match self {
            Decided::Completing(taken) => *taken,
            Decided::Decided(remembered) => remembered.taken,
        }
    }
}

/// `TraceAssembler._decided` and `_decided_order`: trace id -> its decision (or spans taken while it
/// is decided), and the ids in the order they came, to forget the oldest: a key is only ever removed
/// there, so the two hold the same ids, in the same order.
#[derive(Debug)]
struct DecisionCache {
    decided: HashMap<TraceId, Decided, IdHasher>,
    order: VecDeque<TraceId>,
    size: usize,
}

impl DecisionCache {
    /// `decided[trace_id] = spans`, the id appended to the order if new, without trimming.
    /// Returns whether it was new.
    fn put_completing(&mut self, trace_id: TraceId, spans: u32) -> bool {
        match self.decided.entry(trace_id) {
            Entry::Occupied(mut known) => {
                *known.get_mut() = Decided::Completing(spans);
                false
            }
            Entry::Vacant(vacant) => {
                vacant.insert(Decided::Completing(spans));
                self.order.push_back(trace_id);
                true
            }
        }
    }

    /// `TraceAssembler._remember`: completed with `spans` spans, not decided yet.
    fn remember_completed(&mut self, trace_id: TraceId, spans: u32) {
        let known = self.decided.len();
        if self.put_completing(trace_id, spans) && known >= self.size {
            self.forget_beyond_cache();
        }
    }

    /// `TraceAssembler._forget_beyond_cache`.
    fn forget_beyond_cache(&mut self) {
        while self.decided.len() > self.size {
            let Some(oldest) = self.order.pop_front() else { break };
            self.decided.remove(&oldest);
        }
    }

    /// `TraceAssembler._remembered`.
    fn remembered(&self, trace_id: &TraceId) -> Option<&Remembered> {
        match self.decided.get(trace_id) {
            Some(Decided::Decided(remembered)) => Some(remembered),
            _ => None,
        }
    }

    fn heap_bytes(&self) -> usize {
        self.decided.capacity() * (std::mem::size_of::<(TraceId, Decided)>() + 1)
            + self.decided.values().map(|d| match d {
                Decided::Decided(remembered) => remembered.measured.heap_bytes(),
                Decided::Completing(_) => 0,
            }).sum::<usize>()
            + self.order.capacity() * std::mem::size_of::<TraceId>()
    }
}

// --- the buffer ------------------------------------------------------------------------------------

/// `TraceAssembler`: pending traces, their readiness, the ready queue, `max_traces`, traces held for
/// a call in flight, the decision cache and the late spans parked while their trace is decided.
/// Plain data: the engine calls it under its lock, with `now` from its monotonic clock in seconds.
#[derive(Debug)]
pub struct TraceBuffer {
    settings: AssemblySettings,
    traces: Traces,
    /// The ready traces in due order (each the clock when it became ready plus the one grace), so a
    /// tick reads only the due ones and stops at the next: (node, token, ready_at). One that left
    /// otherwise stays until it reaches the front, where its token no longer matches, and is dropped.
    ready: VecDeque<(u32, u64, f64)>,
    tokens: u64,
    held: Held,
    cache: DecisionCache,
    /// Trace id -> late spans that arrived while their trace was being completed (its decision not
    /// yet remembered), each alone: handed on with that decision once the completion is done. As in
    /// Python, spans parked for a trace never decided stay until its id completes here again.
    parked: HashMap<TraceId, Vec<TraceData>, IdHasher>,
    /// What left, in the order Python hands it on, until taken (`take_completions`, `tick`).
    outbox: Vec<Completion>,
    /// The traces an `add_batch` gave a span, each once, in the order first given one; `NIL` once
    /// its trace left during the call. Kept between calls for its allocation.
    touched: Vec<u32>,
    batches: u64,
    /// Spans of the pending traces (`held_spans`).
    spans_held: usize,
    // Counters (`TraceAssembler`'s):
    spans_dropped_over_trace_limit: u64,
    spans_duplicate: u64,
    completions: [u64; Reason::ALL.len()],
    /// A copy whose engine-ness differs from its first copy's replaced it: neither a duplicate nor
    /// dropped in Python's counts, the first copy gone (not a Python counter; for the accounting).
    spans_replaced: u64,
}

impl TraceBuffer {
    /// A buffer with these settings; refused: `max_traces` 0 (the configuration's bound is 1: with
    /// none, Python would go on filling the trace it completed) and more traces than a slab index holds.
    pub fn new(settings: AssemblySettings) -> Result<TraceBuffer, String> {
        if settings.max_traces == 0 || settings.max_traces >= (NIL / 2) as usize {
            return Err(format!("max_traces must be between 1 and {}, got {}", NIL / 2 - 1, settings.max_traces));
        }
        Ok(TraceBuffer {
            settings,
            traces: Traces::new(),
            ready: VecDeque::new(),
            tokens: 0,
            held: Held::new(),
            cache: DecisionCache {
                decided: HashMap::default(),
                order: VecDeque::new(),
                size: settings.decided_cache_size,
            },
            parked: HashMap::default(),
            outbox: Vec::new(),
            touched: Vec::new(),
            batches: 0,
            spans_held: 0,
            spans_dropped_over_trace_limit: 0,
            spans_duplicate: 0,
            completions: [0; Reason::ALL.len()],
            spans_replaced: 0,
        })
    }

    pub fn settings(&self) -> &AssemblySettings {
        &self.settings
    }

    /// `TraceAssembler.__len__`: pending traces.
    pub fn len(&self) -> usize {
        self.traces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.traces.len() == 0
    }

    /// `TraceAssembler.held_spans`: spans of the pending traces.
    pub fn held_spans(&self) -> usize {
        self.spans_held
    }

    /// `TraceAssembler.held_traces`: traces held past `decision_wait` for a call in flight.
    pub fn held_traces(&self) -> usize {
        self.held.len()
    }

    /// `TraceAssembler.held_since`: when the oldest trace held for a call in flight was first seen.
    pub fn held_since(&self) -> Option<f64> {
        self.held.since(&self.traces)
    }

    /// `TraceAssembler.completion_lag`: seconds the longest-due ready entry has waited past its time
    /// (it may belong to a trace that left otherwise, as in Python).
    pub fn completion_lag(&self, now: f64) -> f64 {
        let Some(&(_, _, first)) = self.ready.front() else { return 0.0 };
        let lag = now - first;
        if lag > 0.0 { lag } else { 0.0 } // Python's max(0.0, lag): 0.0 unless lag is greater
    }

    /// `spans_dropped_over_trace_limit`: spans past `max_spans_per_trace`.
    pub fn spans_dropped_over_trace_limit(&self) -> u64 {
        self.spans_dropped_over_trace_limit
    }

    /// `spans_duplicate`: span ids their trace had already (redeliveries).
    pub fn spans_duplicate(&self) -> u64 {
        self.spans_duplicate
    }

    /// Copies that replaced a first copy of another engine-ness (not counted by Python).
    pub fn spans_replaced(&self) -> u64 {
        self.spans_replaced
    }

    /// `completions[reason]`: traces completed for `reason` (late spans are not counted here, as in Python).
    pub fn completions(&self, reason: Reason) -> u64 {
        self.completions[reason.index()]
    }

    /// `_has_parked`.
    pub fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// Completions waiting to be taken (`take_completions`, `tick`): late spans and traces
    /// completed to make room (by `add_batch`), shed, drained, parked spans handed on.
    pub fn waiting_completions(&self) -> usize {
        self.outbox.len()
    }

    /// Late spans parked while their trace is being decided.
    pub fn parked_spans(&self) -> usize {
        self.parked.values().map(Vec::len).sum()
    }

    /// The trace's decision, if it was decided and is still remembered (`_remembered`).
    pub fn remembered(&self, trace_id: &TraceId) -> Option<&Remembered> {
        self.cache.remembered(trace_id)
    }

    /// Heap bytes the buffer holds: every pending, parked and outgoing trace's, and its own
    /// structures' (for the memory accounting). Walks the pending traces and the decision cache.
    pub fn heap_bytes(&self) -> usize {
        let traces = &self.traces;
        let slab = traces.nodes.capacity() * std::mem::size_of::<Node>()
            + traces.free.capacity() * 4
            + traces.index.capacity() * (std::mem::size_of::<(TraceId, u32)>() + 1)
            + traces.order().map(|at| {
                let trace = traces.trace(at);
                trace.data.heap_bytes() + trace.waiters.heap_bytes() + 8 * trace.engine.rest.len()
            }).sum::<usize>();
        let parked = self.parked.capacity() * (std::mem::size_of::<(TraceId, Vec<TraceData>)>() + 1)
            + self.parked.values().map(|spans| {
                spans.capacity() * std::mem::size_of::<TraceData>()
                    + spans.iter().map(TraceData::heap_bytes).sum::<usize>()
            }).sum::<usize>();
        let outbox = self.outbox.capacity() * std::mem::size_of::<Completion>()
            + self.outbox.iter().map(|c| c.trace.heap_bytes() + c.prior.as_ref().map_or(0, |p| p.measured.heap_bytes()))
                .sum::<usize>();
        slab + parked + outbox
            + self.ready.capacity() * std::mem::size_of::<(u32, u64, f64)>()
            + self.held.heap_bytes()
            + self.touched.capacity() * 4
            + self.cache.heap_bytes()
    }

    // --- adding spans ---

    /// One span (`add_batch` of one).
    pub fn add(&mut self, trace_id: TraceId, span: NewSpan<'_>, is_engine: bool, now: f64) -> Added {
        self.add_batch(std::iter::once(Incoming { trace_id, span, is_engine }), now)
    }

    /// `TraceAssembler.add_batch`: a request's spans, in order, at `now`. Readiness is brought up to
    /// date once per trace given a span, after all of them (a trace is not made ready by the first
    /// of its spans in a request when a later one in it is not rooted). What it completes (late
    /// spans of decided traces, then traces completed to make room, as `_hand_on_added` hands them
    /// on) goes to the outbox.
    pub fn add_batch<'a, I>(&mut self, spans: I, now: f64) -> Added
    where
        I: IntoIterator<Item = Incoming<'a>>,
    {
        self.batches += 1;
        let batch = self.batches;
        let mut touched = std::mem::take(&mut self.touched);
        touched.clear();
        let mut added = Added::default();
        let mut late: Vec<Completion> = Vec::new();
        let mut completed: Vec<Completion> = Vec::new();
        for incoming in spans {
            self.add_span(&incoming, now, batch, &mut touched, &mut late, &mut completed, &mut added);
        }
        for &at in &touched {
            if at != NIL {
                self.update_readiness(at, now);
            }
        }
        touched.clear();
        self.touched = touched;
        self.spans_dropped_over_trace_limit += added.dropped;
        self.spans_duplicate += added.duplicate;
        settle_late_priors(&mut late);
        self.outbox.append(&mut late);
        for completion in &completed {
            self.completions[completion.reason.index()] += 1;
        }
        self.outbox.append(&mut completed);
        added
    }

    #[allow(clippy::too_many_arguments)]
    fn add_span(&mut self, incoming: &Incoming<'_>, now: f64, batch: u64, touched: &mut Vec<u32>,
                late: &mut Vec<Completion>, completed: &mut Vec<Completion>, added: &mut Added) {
        let Incoming { trace_id, span, is_engine } = incoming;
        let (trace_id, is_engine) = (*trace_id, *is_engine);
        let limit = self.settings.max_spans_per_trace;
        let at = match self.traces.get(&trace_id) {
            Some(at) => at,
            None => {
                if let Some(decided) = self.cache.decided.get_mut(&trace_id) {
                    match decided {
                        Decided::Decided(remembered) => {
                            if is_engine && remembered.measured.contains(&span.span_id) {
                                added.duplicate += 1; // redelivered (a retried export): measured once already
                            } else if remembered.taken >= limit {
                                added.dropped += 1;
                            } else {
                                remembered.taken += 1;
                                late.push(Completion {
                                    trace: alone(trace_id, span), reason: Reason::Late, late: true,
                                    prior: Some(remembered.clone()),
                                });
                            }
                        }
                        Decided::Completing(taken) => {
                            if *taken >= limit {
                                added.dropped += 1; // its trace is being completed (spans taken so far)
                            } else {
                                *taken += 1; // it waits for the decision and follows it
                                self.parked.entry(trace_id).or_default().push(alone(trace_id, span));
                            }
                        }
                    }
                    return;
                }
                let at = self.traces.insert(trace_id, Pending {
                    data: TraceData::new(trace_id), first_seen: now, ..Pending::default()
                });
                if self.traces.len() > self.settings.max_traces {
                    let (freed, reason) = self.make_room(now);
                    if freed.batch == batch {
                        touched[freed.touched_at as usize] = NIL;
                    }
                    completed.push(Completion { trace: freed.data, reason, late: false, prior: None });
                }
                at
            }
        };
        // The span goes in, and readiness is kept current in steps bounded by `MAX_ANCESTRY` per
        // engine span over its life, never by the number of spans the trace holds.
        let trace = self.traces.trace_mut(at);
        let previous = trace.data.find(&span.span_id);
        let previous_engine = previous.map(|p| trace.engine.get(p));
        if previous.is_some() && previous_engine == Some(is_engine) {
            added.duplicate += 1; // the same span again (a retried export): it replaces its first copy
        } else if trace.data.len() >= limit as usize {
            added.dropped += 1;
            return;
        } else if previous.is_some() {
            self.spans_replaced += 1;
        }
        let slot = trace.data.put(span);
        if previous.is_none() {
            self.spans_held += 1;
        }
        trace.engine.set(slot, is_engine);
        if is_engine {
            trace.engine_seen_at = now;
            if previous_engine != Some(true) {
                trace.has_engine_span = true;
                trace.unrooted += 1;
                walk(&trace.data, &mut trace.waiters, &mut trace.unrooted, slot, 0);
            }
        }
        // A duplicate keeps the readiness its first copy gave (span ids are unique in a valid trace;
        // a conflicting copy can at worst hold its trace until `decision_wait`).
        if previous.is_none() {
            match trace.waiters.pop(&span.span_id) {
                None => {}
                Some(Resumed::One(found)) => {
                    walk(&trace.data, &mut trace.waiters, &mut trace.unrooted, slot, found as usize + 1);
                }
                Some(Resumed::Many(founds)) => {
                    for found in founds {
                        walk(&trace.data, &mut trace.waiters, &mut trace.unrooted, slot, found as usize + 1);
                    }
                }
            }
        }
        if trace.batch != batch {
            trace.batch = batch;
            trace.touched_at = touched.len() as u32;
            touched.push(at);
        }
    }

    /// `TraceAssembler._update_readiness`.
    fn update_readiness(&mut self, at: u32, now: f64) {
        let grace = self.settings.grace_s;
        let trace = self.traces.trace_mut(at);
        if !trace.has_engine_span || trace.unrooted != 0 || trace.ready_token != 0 {
            return;
        }
        self.tokens += 1;
        trace.ready_at = now + grace;
        trace.ready_token = self.tokens;
        self.ready.push_back((at, self.tokens, trace.ready_at));
    }

    /// `TraceAssembler._pop_due`: the ready trace due first, its entry removed, if it is due at
    /// `now`; entries of traces that left otherwise are dropped on the way. The trace stays pending.
    fn pop_due(&mut self, now: f64) -> Option<u32> {
        while let Some(&(at, token, ready_at)) = self.ready.front() {
            let current = self.traces.nodes.get(at as usize).is_some_and(|node| node.trace.ready_token == token);
            if current && ready_at > now {
                return None;
            }
            self.ready.pop_front();
            if current {
                return Some(at);
            }
        }
        None
    }

    /// The trace at `at` out of the pending ones (and the held ones), not remembered.
    fn remove(&mut self, at: u32) -> (TraceId, Pending) {
        self.held.release(&mut self.traces, at);
        let (trace_id, trace) = self.traces.remove(at);
        self.spans_held -= trace.data.len();
        (trace_id, trace)
    }

    /// The trace at `at` out, remembered as completed, undecided (`_pop_oldest`'s and
    /// `_make_room`'s `del`, `_held.pop` and `_remember`).
    fn leave(&mut self, at: u32) -> (TraceId, Pending) {
        let (trace_id, trace) = self.remove(at);
        self.cache.remember_completed(trace_id, trace.data.len() as u32);
        (trace_id, trace)
    }

    /// `TraceAssembler._pop_oldest`.
    fn pop_oldest(&mut self) -> Option<Pending> {
        let head = self.traces.head;
        (head != NIL).then(|| self.leave(head).1)
    }

    /// `TraceAssembler._make_room`: at `max_traces`, a trace whose grace is over is complete, not cut
    /// short, so the longest-due one goes first ("ready", what the ticker, behind, would have done);
    /// when none is due, one is completed early ("memory_limit"): the one held longest for a call in
    /// flight, which has had its `decision_wait`, before any still inside it; the oldest when none
    /// is held. Called with the new trace pending past `max_traces` (at least 1), so there is an
    /// older one.
    fn make_room(&mut self, now: f64) -> (Pending, Reason) {
        if let Some(at) = self.pop_due(now) {
            return (self.leave(at).1, Reason::Ready);
        }
        let at = self.held.first().unwrap_or(self.traces.head);
        (self.leave(at).1, Reason::MemoryLimit)
    }

    // --- completing ---

    /// What left and has not been taken yet, in order: late spans and traces completed to make room
    /// (by `add_batch`), traces completed by `shed`, `drain` and `complete_now`, and parked late
    /// spans handed on (`hand_on_parked`).
    pub fn take_completions(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.outbox)
    }

    /// `take_completions`, appended to `out` (a vector the caller keeps for its allocation).
    pub fn take_completions_into(&mut self, out: &mut Vec<Completion>) {
        out.append(&mut self.outbox);
    }

    fn complete(&mut self, trace: TraceData, reason: Reason) {
        self.completions[reason.index()] += 1;
        self.outbox.push(Completion { trace, reason, late: false, prior: None });
    }

    /// `TraceAssembler.tick`: what is still in the outbox, then every trace whose time has come,
    /// in the order Python completes them: the ready traces due (in due order), then from the
    /// oldest, every trace `decision_wait` old, except one with a call in flight (`_call_in_flight`,
    /// while `max_open_call_wait` is on) that is held until `max_open_call_wait`, moved behind the
    /// others and looked at again once the traces seen after it are due; then, for each sender this
    /// tick took past `max_open_calls_per_sender`, its longest-held traces past it ("open_call_limit").
    pub fn tick(&mut self, now: f64) -> Vec<Completion> {
        let mut out = Vec::new();
        self.tick_into(now, &mut out);
        out
    }

    /// `tick`, appended to `out`: a vector the caller keeps, so the completions (a trace's
    /// `TraceData` each) are moved once, not again each time a new vector grows.
    pub fn tick_into(&mut self, now: f64, out: &mut Vec<Completion>) {
        out.append(&mut self.outbox);
        // What the tick completes goes straight to `out`; the outbox's own vector comes back empty.
        std::mem::swap(&mut self.outbox, out);
        self.complete_due(now);
        std::mem::swap(&mut self.outbox, out);
    }

    fn complete_due(&mut self, now: f64) {
        if !self.ready.is_empty() {
            while let Some(at) = self.pop_due(now) {
                let (trace_id, trace) = self.remove(at);
                // `_remember`, inlined as in Python: the cache is trimmed once below.
                self.cache.put_completing(trace_id, trace.data.len() as u32);
                self.complete(trace.data, Reason::Ready);
            }
            self.cache.forget_beyond_cache();
        }
        let deadline = now - self.settings.decision_wait_s;
        let open_deadline = now - self.settings.max_open_call_wait_s;
        let holding = self.settings.max_open_call_wait_s > 0.0;
        let bound = self.settings.max_open_calls_per_sender;
        let mut examined_held = 0usize;
        let mut over_bound: Vec<Box<str>> = Vec::new(); // senders taken past max_open_calls_per_sender
        while self.traces.head != NIL {
            let head = self.traces.head;
            let trace = self.traces.trace(head);
            if trace.first_seen > deadline {
                break;
            }
            // Held while nothing was measured yet (the engine's request is in flight too), or for
            // decision_wait after its engine span came (its caller's span follows it).
            let in_flight = if holding && (trace.engine_seen_at == 0.0 || trace.engine_seen_at > deadline) {
                call_in_flight(&trace.data)
            } else {
                None
            };
            if let Some(span_at) = in_flight.filter(|_| trace.first_seen > open_deadline) {
                // Its caller's span has not arrived: held, looked at again once the traces seen
                // after it are due (so at most decision_wait past the limit).
                if let Some(sender) = self.held.hold(&mut self.traces, head, span_at, bound) {
                    over_bound.push(sender);
                }
                self.traces.move_to_end(head);
                examined_held += 1;
                if examined_held >= self.traces.len() {
                    break;
                }
                continue;
            }
            let reason = if in_flight.is_some() { Reason::MaxOpenCallWait } else { Reason::DecisionWait };
            if let Some(trace) = self.pop_oldest() {
                self.complete(trace.data, reason);
            }
        }
        self.past_sender_bound(&over_bound);
    }

    /// `TraceAssembler._past_sender_bound`: the longest-held traces of `senders` (by name, in the
    /// order the tick took them past it, as Python's list) past `max_open_calls_per_sender`,
    /// completed ("open_call_limit").
    fn past_sender_bound(&mut self, senders: &[Box<str>]) {
        let bound = self.settings.max_open_calls_per_sender;
        for sender in senders {
            while let Some(at) = self.held.first_past_bound(sender, bound) {
                let trace = self.leave(at).1;
                self.complete(trace.data, Reason::OpenCallLimit);
            }
        }
    }

    /// `TraceAssembler.shed`: the oldest `fraction` of pending traces completed now (memory
    /// pressure), `int(len * fraction)` of them; returns how many. Python raises for a fraction
    /// past 1 or NaN (its memory limiter passes 0.5); here the count is clamped to 0..=len.
    pub fn shed(&mut self, fraction: f64) -> usize {
        let wanted = (self.traces.len() as f64 * fraction) as usize; // truncated as int(); NaN: 0
        let count = wanted.min(self.traces.len());
        for _ in 0..count {
            if let Some(trace) = self.pop_oldest() {
                self.complete(trace.data, Reason::MemoryPressure);
            }
        }
        count
    }

    /// `TraceAssembler.overdue`: the pending traces first seen at or before `seen_before` (still
    /// pending past `decision_wait`: held for a call in flight) and those `carried` picks by id, in
    /// the pending order (held ones behind those they were moved behind), left in place: what the
    /// intake log carries past its checkpoint. Python's are copies (its `PendingTrace`s are handed
    /// out of the lock); here they are borrowed until the caller has taken what it needs of them.
    pub fn overdue<'a>(&'a self, seen_before: f64, mut carried: impl FnMut(&TraceId) -> bool + 'a)
        -> impl Iterator<Item = &'a TraceData> + 'a {
        self.traces.order().map(|at| self.traces.trace(at)).filter_map(move |trace| {
            (trace.first_seen <= seen_before || carried(&trace.data.trace_id)).then_some(&trace.data)
        })
    }

    /// `TraceAssembler.take_pending`: the pending traces `pick` picks, oldest first, removed
    /// undecided (a graceful stop hands them to the next start): not remembered as decided, so
    /// nothing of them is late here or there.
    pub fn take_pending(&mut self, mut pick: impl FnMut(&TraceData) -> bool) -> Vec<TraceData> {
        let mut taken = Vec::new();
        let mut at = self.traces.head;
        while at != NIL {
            let next = self.traces.nodes[at as usize].next;
            if pick(&self.traces.trace(at).data) {
                taken.push(self.remove(at).1.data);
            }
            at = next;
        }
        taken
    }

    /// `TraceAssembler.complete_now`: traces taken with `take_pending` decided after all (their
    /// hand-over could not be written), remembered as completed, then completed for `reason`.
    pub fn complete_now(&mut self, traces: Vec<TraceData>, reason: Reason) {
        for trace in &traces {
            self.cache.remember_completed(trace.trace_id, trace.len() as u32);
        }
        for trace in traces {
            self.complete(trace, reason);
        }
    }

    /// `TraceAssembler.drain`: every pending trace completed now, oldest first (shutdown); returns how many.
    pub fn drain(&mut self) -> usize {
        let mut count = 0;
        while let Some(trace) = self.pop_oldest() {
            self.complete(trace.data, Reason::Shutdown);
            count += 1;
        }
        count
    }

    // --- the decision cache ---

    /// `TraceAssembler.remember_decisions`, for one trace: the chain's decision of a trace
    /// completed here, taking the spans counted so far; one the cache forgot meanwhile stays
    /// forgotten. Its parked late spans follow it once `hand_on_parked` is called for it.
    pub fn remember(&mut self, trace_id: &TraceId, mut remembered: Remembered) {
        if let Some(known) = self.cache.decided.get_mut(trace_id) {
            remembered.taken = known.taken();
            *known = Decided::Decided(remembered);
        }
    }

    /// `Remembered.add_measured` on the cache's decision of `trace_id` (a late engine span measured
    /// by the chain); nothing where it is not remembered.
    pub fn add_measured(&mut self, trace_id: &TraceId, span_id: SpanId) {
        if let Some(Decided::Decided(remembered)) = self.cache.decided.get_mut(trace_id) {
            remembered.measured.insert(span_id);
        }
    }

    /// `TraceAssembler._hand_on_parked`: the late spans parked for these traces, each with its
    /// trace's decision if remembered, into the outbox, in the order of `trace_ids`. Python calls
    /// it with the ids of each batch of `COMPLETION_BATCH` completions after the chain took it.
    pub fn hand_on_parked<'t>(&mut self, trace_ids: impl IntoIterator<Item = &'t TraceId>) {
        if self.parked.is_empty() {
            return;
        }
        for trace_id in trace_ids {
            let Some(parked) = self.parked.remove(trace_id) else { continue };
            let prior = self.cache.remembered(trace_id);
            for trace in parked {
                self.outbox.push(Completion { trace, reason: Reason::Late, late: true, prior: prior.cloned() });
            }
        }
    }

    /// `TraceAssembler.decisions`: the decision cache's decisions, oldest first (for a graceful restart).
    pub fn decisions(&self) -> Vec<(TraceId, Remembered)> {
        self.cache.order.iter()
            .filter_map(|trace_id| self.cache.remembered(trace_id).map(|r| (*trace_id, r.clone())))
            .collect()
    }

    /// `TraceAssembler.restore_decisions`: decisions of the previous run (before any span arrives):
    /// a span it had taken, redelivered by a sender that never got the answer, is then a duplicate.
    pub fn restore_decisions(&mut self, decisions: impl IntoIterator<Item = (TraceId, Remembered)>) {
        for (trace_id, mut remembered) in decisions {
            match self.cache.decided.get(&trace_id) {
                None => {
                    remembered.taken = remembered.measured.len() as u32;
                    self.cache.order.push_back(trace_id);
                }
                Some(known) => remembered.taken = known.taken(),
            }
            self.cache.decided.insert(trace_id, Decided::Decided(remembered));
            self.cache.forget_beyond_cache();
        }
    }
}

/// `_late`'s trace: the span alone, in a trace of its own.
fn alone(trace_id: TraceId, span: &NewSpan<'_>) -> TraceData {
    let mut data = TraceData::new(trace_id);
    data.put(span);
    data
}

/// The late spans of one `add_batch` carry their trace's decision as Python's chain sees it after
/// the call: one object per trace, so each shows the spans taken by the last of them.
fn settle_late_priors(late: &mut [Completion]) {
    if late.len() < 2 {
        return;
    }
    let mut last: HashMap<TraceId, u32, IdHasher> = HashMap::default();
    for completion in late.iter() {
        if let Some(prior) = &completion.prior {
            last.insert(completion.trace.trace_id, prior.taken);
        }
    }
    for completion in late.iter_mut() {
        if let (Some(prior), Some(taken)) = (&mut completion.prior, last.get(&completion.trace.trace_id)) {
            prior.taken = *taken;
        }
    }
}

#[cfg(test)]
mod tests;
