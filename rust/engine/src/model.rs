//! The engine's data model: a buffered trace's spans as native values in the trace's own arena,
//! the observations an engine's span gives, and the schemas that name their fields.
//!
//! A trace owns one byte arena (`TraceData::bytes`) holding its spans' bytes, its origins'
//! resources and scopes and its observations' texts, and one word arena (`TraceData::words`)
//! holding its observations' numbers: a span is a fixed `SpanSlot` of ids, times and ranges into
//! those, so buffering a span allocates nothing of its own and a completed trace is freed in one
//! go. Fields are named by the schemas Python declares (`otel_llm/pdata/observation.py`'s
//! `OBSERVATION_FIELDS`, `RequestRecord`'s fields) and looked up by name once, at construction:
//! the engine never relies on a field's position in a Python class.

use std::collections::HashMap;

use crate::wire::{delimited_len, entry_key, push_varint, utf8, Reader};


pub type TraceId = [u8; 16];
pub type SpanId = [u8; 8];

pub const SPAN_KIND_INTERNAL: i32 = 1;
pub const SPAN_KIND_SERVER: i32 = 2;
pub const SPAN_KIND_CLIENT: i32 = 3;
pub const STATUS_CODE_ERROR: i32 = 2;

/// How many ancestors a readiness check or a join walks at most: a cycle in hostile input must
/// not hang the engine, and a deeper chain is not a gateway path (`pdata.spans.MAX_ANCESTRY`).
pub const MAX_ANCESTRY: usize = 64;

// --- schemas ---------------------------------------------------------------------------------

/// What a declared field holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Kind {
    Float,
    Int,
    Text,
    Flag,
    /// A list of floats (vLLM's per-step inter-token latencies).
    Floats,
    /// A list of texts (the segments an engine's numbers were derived for).
    Texts,
}

impl Kind {
    pub fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "float" => Kind::Float,
            "int" => Kind::Int,
            "text" => Kind::Text,
            "flag" => Kind::Flag,
            "floats" => Kind::Floats,
            "texts" => Kind::Texts,
            _ => return None,
        })
    }
}

/// A field's position in its schema. At most 64 fields: an observation's presence is one word.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct FieldId(pub u8);

/// Named, typed fields, in the order Python declared them.
#[derive(Clone, Debug, Default)]
pub struct Schema {
    names: Vec<String>,
    kinds: Vec<Kind>,
    by_name: HashMap<String, FieldId>,
}

pub const MAX_FIELDS: usize = 64;

impl Schema {
    pub fn new(fields: Vec<(String, Kind)>) -> Result<Schema, String> {
        if fields.len() > MAX_FIELDS {
            return Err(format!("{} fields declared; the engine holds at most {MAX_FIELDS}", fields.len()));
        }
        let mut schema = Schema::default();
        for (name, kind) in fields {
            let id = FieldId(schema.names.len() as u8);
            if schema.by_name.insert(name.clone(), id).is_some() {
                return Err(format!("field {name:?} declared twice"));
            }
            schema.names.push(name);
            schema.kinds.push(kind);
        }
        Ok(schema)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn id(&self, name: &str) -> Option<FieldId> {
        self.by_name.get(name).copied()
    }

    /// The field the engine's own rules read by this name, of this kind: a declaration that lost
    /// or changed it is an error at construction, not a wrong reading later.
    pub fn require(&self, name: &str, kind: Kind) -> Result<FieldId, String> {
        let id = self.id(name).ok_or_else(|| format!("no field {name:?} is declared"))?;
        let declared = self.kind(id);
        if declared != kind {
            return Err(format!("field {name:?} is declared {declared:?}; the engine reads it as {kind:?}"));
        }
        Ok(id)
    }

    pub fn name(&self, id: FieldId) -> &str {
        &self.names[id.0 as usize]
    }

    pub fn kind(&self, id: FieldId) -> Kind {
        self.kinds[id.0 as usize]
    }

    pub fn ids(&self) -> impl Iterator<Item = FieldId> {
        (0..self.names.len() as u8).map(FieldId)
    }
}

// --- decisions ---------------------------------------------------------------------------------

/// A policy name or an OTel sampling threshold, interned in the engine's `Names`: a decision (held
/// by the hundred thousand in the decision cache) is four bytes of ids, not two strings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameId(pub u16);

/// The names decisions refer to: the configured policies' names and thresholds, and those a
/// previous run journaled (`NameId(0)` is ""). Bounded: past `u16::MAX` names a new one is ""
/// (only a journal of a very different configuration could get there).
#[derive(Clone, Debug)]
pub struct Names {
    names: Vec<String>,
    by_name: HashMap<String, NameId>,
}

impl Default for Names {
    fn default() -> Names {
        let mut names = Names { names: Vec::new(), by_name: HashMap::new() };
        names.intern("");
        names
    }
}

impl Names {
    pub fn intern(&mut self, name: &str) -> NameId {
        if let Some(id) = self.by_name.get(name) {
            return *id;
        }
        if self.names.len() >= u16::MAX as usize {
            return NameId(0);
        }
        let id = NameId(self.names.len() as u16);
        self.names.push(name.to_owned());
        self.by_name.insert(name.to_owned(), id);
        id
    }

    pub fn get(&self, name: &str) -> Option<NameId> {
        self.by_name.get(name).copied()
    }

    pub fn name(&self, id: NameId) -> &str {
        self.names.get(id.0 as usize).map_or("", String::as_str)
    }
}

/// `pdata.traces.Decision`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub keep: bool,
    pub rate_limited: bool,
    /// The first policy that matched (stamped on kept spans as `otel_llm.sampling.policy`).
    pub policy: NameId,
    /// OTel `th` of the probability the trace was kept with ("0" = always).
    pub threshold: NameId,
}

/// `pdata.traces.DROP`.
pub const DROP: Decision = Decision { keep: false, rate_limited: false, policy: NameId(0), threshold: NameId(0) };

// --- values ----------------------------------------------------------------------------------

/// A field's value, owned: as a reader makes it, or as Python hands one over.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Float(f64),
    Int(i64),
    Text(String),
    Flag(bool),
    Floats(Vec<f64>),
    Texts(Vec<String>),
}

impl Value {
    pub fn kind(&self) -> Kind {
        match self {
            Value::Float(_) => Kind::Float,
            Value::Int(_) => Kind::Int,
            Value::Text(_) => Kind::Text,
            Value::Flag(_) => Kind::Flag,
            Value::Floats(_) => Kind::Floats,
            Value::Texts(_) => Kind::Texts,
        }
    }

    pub fn as_ref(&self) -> ValueRef<'_> {
        match self {
            Value::Float(v) => ValueRef::Float(*v),
            Value::Int(v) => ValueRef::Int(*v),
            Value::Text(v) => ValueRef::Text(v),
            Value::Flag(v) => ValueRef::Flag(*v),
            Value::Floats(v) => ValueRef::Floats(Floats::Slice(v)),
            Value::Texts(v) => ValueRef::Texts(Texts::Owned(v)),
        }
    }
}

/// A field's value as read where it is held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    Float(f64),
    Int(i64),
    Text(&'a str),
    Flag(bool),
    Floats(Floats<'a>),
    Texts(Texts<'a>),
}

impl<'a> ValueRef<'a> {
    pub fn to_owned(self) -> Value {
        match self {
            ValueRef::Float(v) => Value::Float(v),
            ValueRef::Int(v) => Value::Int(v),
            ValueRef::Text(v) => Value::Text(v.to_owned()),
            ValueRef::Flag(v) => Value::Flag(v),
            ValueRef::Floats(v) => Value::Floats(v.iter().collect()),
            ValueRef::Texts(v) => Value::Texts(v.iter().map(str::to_owned).collect()),
        }
    }
}

/// Floats held as little-endian words in an arena, or in a slice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Floats<'a> {
    Packed(&'a [u8]),
    Slice(&'a [f64]),
}

impl<'a> Floats<'a> {
    pub fn len(&self) -> usize {
        match self {
            Floats::Packed(bytes) => bytes.len() / 8,
            Floats::Slice(values) => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(self) -> impl Iterator<Item = f64> + 'a {
        let (packed, slice): (&'a [u8], &'a [f64]) = match self {
            Floats::Packed(bytes) => (bytes, &[]),
            Floats::Slice(values) => (&[], values),
        };
        packed.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).chain(slice.iter().copied())
    }
}

/// Texts held as (u32 length, bytes) runs in an arena, or owned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Texts<'a> {
    Packed(&'a [u8]),
    Owned(&'a [String]),
}

impl<'a> Texts<'a> {
    pub fn iter(self) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        match self {
            Texts::Owned(values) => Box::new(values.iter().map(String::as_str)),
            Texts::Packed(mut bytes) => Box::new(std::iter::from_fn(move || {
                if bytes.len() < 4 {
                    return None;
                }
                let len = u32::from_le_bytes(bytes[..4].try_into().ok()?) as usize;
                let text = std::str::from_utf8(bytes.get(4..4 + len)?).ok()?;
                bytes = &bytes[4 + len..];
                Some(text)
            })),
        }
    }
}

/// What an adapter read off one span: which shape matched, and its fields. `shape` indexes the
/// shape table the engine was built with (`shapes::ShapeTable`); the values are in field order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    pub shape: u16,
    pub values: Vec<(FieldId, Value)>,
}

impl Observation {
    pub fn new(shape: u16) -> Observation {
        Observation { shape, values: Vec::new() }
    }

    /// Sets `id` (a later set of the same field replaces it).
    pub fn set(&mut self, id: FieldId, value: Value) {
        match self.values.binary_search_by_key(&id, |(f, _)| *f) {
            Ok(at) => self.values[at].1 = value,
            Err(at) => self.values.insert(at, (id, value)),
        }
    }

    pub fn get(&self, id: FieldId) -> Option<ValueRef<'_>> {
        self.values.binary_search_by_key(&id, |(f, _)| *f).ok().map(|at| self.values[at].1.as_ref())
    }
}

// --- shapes ----------------------------------------------------------------------------------

/// What a shape (an adapter of `adapters/engines.py`, declared in Python's shape table) says of
/// every observation it makes: the fields `EngineObservation` holds that do not vary per span.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShapeInfo {
    /// The adapter's name (`EngineObservation.adapter`, the label of `otel_llm_spans_matched`).
    pub adapter: String,
    /// `EngineKind`: vllm, sglang, tgi, genai, triton, trtllm, dynamo, llm-d.
    pub engine_kind: String,
    /// `Part` ("" for a request's own span): a span read from its request's root at assembly.
    pub part: String,
    /// A GenAI-semconv span that may be a gateway in front of an engine rather than a request.
    pub may_be_gateway: bool,
    /// Requests of this shape are read by Python only (composite engines, disaggregated pairs):
    /// a trace holding such a span is declined by the record builder.
    pub python_records: bool,
}

impl ShapeInfo {
    /// `BufferedSpan.is_engine`: an engine's own request span.
    pub fn is_engine(&self) -> bool {
        !self.may_be_gateway && self.part.is_empty()
    }
}

// --- a trace's spans in its arena -----------------------------------------------------------------

/// A range of an arena: (offset, length).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range32 {
    pub at: u32,
    pub len: u32,
}

impl Range32 {
    fn of(start: usize, len: usize) -> Range32 {
        Range32 { at: start as u32, len: len as u32 }
    }

    fn get(self, bytes: &[u8]) -> &[u8] {
        &bytes[self.at as usize..(self.at + self.len) as usize]
    }
}

/// Where a span came from: its resource and scope, as their bytes in the trace's arena (each
/// distinct pair once per trace), and the resource's `service.name`.
#[derive(Clone, Copy, Debug, Default)]
pub struct OriginSlot {
    pub resource: Range32,
    pub scope: Range32,
    pub service_name: Range32,
}

/// An observation packed into its trace: which fields are present (a bit per field id) and where
/// their words start in `TraceData::words`, one word per present field in field order. A float is
/// its bits, an int itself, a flag 0 or 1, a text or a list its `Range32` in the byte arena
/// (`at << 32 | len`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObsSlot {
    pub shape: u16,
    pub mask: u64,
    /// The present fields whose word is a range of the byte arena (texts, lists).
    pub ranged: u64,
    pub at: u32,
}

pub const NO_SHAPE: u16 = u16::MAX;

/// How a span's bytes are held: as received, or without the fields its slot holds anyway (the ids;
/// also kind and times), in the order every OTLP serializer writes them (field-number order).
/// `payload` rebuilds the bytes as received exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyForm {
    AsReceived,
    WithoutIds,
    WithoutIdsAndTimes,
}

/// One buffered span.
#[derive(Clone, Copy, Debug)]
pub struct SpanSlot {
    pub span_id: SpanId,
    pub parent_span_id: SpanId,
    pub has_parent: bool,
    pub kind: i32,
    pub status_code: i32,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub body: Range32,
    pub body_form: BodyForm,
    pub trace_state: Range32,
    pub name: Range32,
    pub origin: u16,
    pub obs: ObsSlot,
    /// Whether assembly may read the span's attributes: Python keeps the few it reads only of spans
    /// an adapter looked at (`classify`'s candidates, not SGLang's stage spans).
    pub attrs_kept: bool,
}

impl SpanSlot {
    /// The parent's id, if the span has one.
    pub fn parent(&self) -> Option<&SpanId> {
        self.has_parent.then_some(&self.parent_span_id)
    }
}

/// What a span is made of, as ingest hands it to the buffer.
pub struct NewSpan<'a> {
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub kind: i32,
    pub status_code: i32,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    /// The span's bytes (a `Span` message) as they are to be kept.
    pub payload: &'a [u8],
    pub trace_state: &'a str,
    pub resource: &'a [u8],
    pub scope: &'a [u8],
    pub service_name: &'a str,
    pub observation: Option<&'a Observation>,
    /// Whether assembly may read the span's attributes (`SpanSlot::attrs_kept`).
    pub attrs_kept: bool,
}

/// One trace's spans, their bytes and their observations.
#[derive(Debug, Default)]
pub struct TraceData {
    pub trace_id: TraceId,
    pub bytes: Vec<u8>,
    pub words: Vec<u64>,
    pub spans: Vec<SpanSlot>,
    pub origins: Vec<OriginSlot>,
    /// Span id -> slot, made once a trace holds more spans than a linear look-up suits.
    index: Option<HashMap<SpanId, u32>>,
    /// Bytes of the arenas no longer referred to (spans replaced by a later copy).
    garbage: usize,
}

/// Spans a trace is searched through linearly before it keeps an index of them.
const LINEAR_LOOKUP: usize = 16;

impl TraceData {
    pub fn new(trace_id: TraceId) -> TraceData {
        TraceData { trace_id, ..TraceData::default() }
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The slot of span `span_id`, if the trace holds it.
    pub fn find(&self, span_id: &SpanId) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(span_id).map(|at| *at as usize),
            None => self.spans.iter().position(|slot| slot.span_id == *span_id),
        }
    }

    /// Adds `span` and returns its slot; where the trace holds the same span id already, the new
    /// copy replaces it in that slot (a redelivered span). The arenas are compacted when replaced
    /// copies would otherwise make up more than half of them.
    pub fn put(&mut self, span: &NewSpan<'_>) -> usize {
        let slot = self.pack(span);
        match self.find(&span.span_id) {
            Some(at) => {
                self.garbage += self.footprint(&self.spans[at]);
                self.spans[at] = slot;
                if self.garbage > self.bytes.len() / 2 + 4096 {
                    self.compact();
                }
                at
            }
            None => {
                let at = self.spans.len();
                self.spans.push(slot);
                match &mut self.index {
                    Some(index) => {
                        index.insert(span.span_id, at as u32);
                    }
                    None if self.spans.len() > LINEAR_LOOKUP => {
                        self.index = Some(self.spans.iter().enumerate().map(|(i, s)| (s.span_id, i as u32)).collect());
                    }
                    None => {}
                }
                at
            }
        }
    }

    fn pack(&mut self, span: &NewSpan<'_>) -> SpanSlot {
        let origin = self.origin_of(span.resource, span.scope, span.service_name);
        let mut slot = SpanSlot {
            span_id: span.span_id,
            parent_span_id: span.parent_span_id.unwrap_or([0; 8]),
            has_parent: span.parent_span_id.is_some(),
            kind: span.kind,
            status_code: span.status_code,
            start_unix_ns: span.start_unix_ns,
            end_unix_ns: span.end_unix_ns,
            body: Range32::default(),
            body_form: BodyForm::AsReceived,
            trace_state: self.push_bytes(span.trace_state.as_bytes()),
            name: Range32::default(),
            origin,
            obs: ObsSlot { shape: NO_SHAPE, mask: 0, ranged: 0, at: 0 },
            attrs_kept: span.attrs_kept,
        };
        let (form, pieces) = compact_pieces(&self.trace_id, &slot, span.payload, span.trace_state.is_empty());
        slot.body_form = form;
        let start = self.bytes.len();
        for piece in pieces {
            self.bytes.extend_from_slice(piece);
        }
        slot.body = Range32::of(start, self.bytes.len() - start);
        slot.name = self.name_in_body(&slot);
        if let Some(observation) = span.observation {
            slot.obs = self.pack_observation(observation);
        }
        slot
    }

    fn push_bytes(&mut self, data: &[u8]) -> Range32 {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(data);
        Range32::of(start, data.len())
    }

    fn origin_of(&mut self, resource: &[u8], scope: &[u8], service_name: &str) -> u16 {
        for (index, origin) in self.origins.iter().enumerate() {
            if origin.resource.get(&self.bytes) == resource && origin.scope.get(&self.bytes) == scope {
                return index as u16;
            }
        }
        // A trace whose spans come from more origins than a slot can number shares the last one's
        // index for the rest: a hostile trace, and each span keeps its own bytes either way.
        if self.origins.len() >= u16::MAX as usize {
            return (self.origins.len() - 1) as u16;
        }
        let origin = OriginSlot {
            resource: self.push_bytes(resource),
            scope: self.push_bytes(scope),
            service_name: self.push_bytes(service_name.as_bytes()),
        };
        self.origins.push(origin);
        (self.origins.len() - 1) as u16
    }

    fn pack_observation(&mut self, observation: &Observation) -> ObsSlot {
        let at = self.words.len() as u32;
        let (mut mask, mut ranged) = (0u64, 0u64);
        for (id, value) in &observation.values {
            mask |= 1 << id.0;
            if matches!(value, Value::Text(_) | Value::Floats(_) | Value::Texts(_)) {
                ranged |= 1 << id.0;
            }
            let word = match value {
                Value::Float(v) => v.to_bits(),
                Value::Int(v) => *v as u64,
                Value::Flag(v) => u64::from(*v),
                Value::Text(v) => range_word(self.push_bytes(v.as_bytes())),
                Value::Floats(values) => {
                    let start = self.bytes.len();
                    for v in values {
                        self.bytes.extend_from_slice(&v.to_le_bytes());
                    }
                    range_word(Range32::of(start, self.bytes.len() - start))
                }
                Value::Texts(values) => {
                    let start = self.bytes.len();
                    for v in values {
                        self.bytes.extend_from_slice(&(v.len() as u32).to_le_bytes());
                        self.bytes.extend_from_slice(v.as_bytes());
                    }
                    range_word(Range32::of(start, self.bytes.len() - start))
                }
            };
            self.words.push(word);
        }
        ObsSlot { shape: observation.shape, mask, ranged, at }
    }

    /// Arena bytes and words a slot refers to (what replacing it leaves behind).
    fn footprint(&self, slot: &SpanSlot) -> usize {
        slot.body.len as usize + slot.trace_state.len as usize + 8 * slot.obs.mask.count_ones() as usize
    }

    /// Rewrites the arenas with only what the slots refer to.
    fn compact(&mut self) {
        let mut fresh = TraceData::new(self.trace_id);
        fresh.origins.reserve(self.origins.len());
        for origin in &self.origins {
            let resource = fresh.push_bytes(origin.resource.get(&self.bytes));
            let scope = fresh.push_bytes(origin.scope.get(&self.bytes));
            let service_name = fresh.push_bytes(origin.service_name.get(&self.bytes));
            fresh.origins.push(OriginSlot { resource, scope, service_name });
        }
        for slot in &self.spans {
            let mut moved = *slot;
            moved.trace_state = fresh.push_bytes(slot.trace_state.get(&self.bytes));
            let body_start = fresh.bytes.len() as u32;
            fresh.bytes.extend_from_slice(slot.body.get(&self.bytes));
            moved.body = Range32 { at: body_start, len: slot.body.len };
            moved.name = Range32 { at: body_start + (slot.name.at - slot.body.at), len: slot.name.len };
            if slot.obs.shape != NO_SHAPE {
                moved.obs = ObsSlot { at: fresh.words.len() as u32, ..slot.obs };
                let mut mask = slot.obs.mask;
                let mut at = slot.obs.at as usize;
                while mask != 0 {
                    let bit = mask & mask.wrapping_neg();
                    let word = self.words[at];
                    let moved_word = if slot.obs.ranged & bit != 0 {
                        range_word(fresh.push_bytes(word_range(word).get(&self.bytes)))
                    } else {
                        word
                    };
                    fresh.words.push(moved_word);
                    mask &= mask - 1;
                    at += 1;
                }
            }
            fresh.spans.push(moved);
        }
        fresh.index = self.index.take();
        *self = fresh;
    }

    /// The name's range within the body (`Span.name`, field 5; "" when absent).
    fn name_in_body(&self, slot: &SpanSlot) -> Range32 {
        let body = slot.body.get(&self.bytes);
        let base = slot.body.at as usize;
        let mut reader = Reader::new(body, 0, body.len());
        let mut found = Range32::of(base, 0);
        while !reader.done() {
            let Ok((number, wire_type)) = reader.tag() else { break };
            if number == 5 && wire_type == 2 {
                match reader.delimited() {
                    Ok((s, e)) => found = Range32::of(base + s, e - s),
                    Err(_) => break,
                }
            } else if reader.skip(number, wire_type, 0).is_err() {
                break;
            }
        }
        found
    }

    // --- reading ---

    pub fn span(&self, at: usize) -> &SpanSlot {
        &self.spans[at]
    }

    /// The span's name ("" when it has none or it is not UTF-8, which the receivers refuse).
    pub fn name(&self, at: usize) -> &str {
        std::str::from_utf8(self.spans[at].name.get(&self.bytes)).unwrap_or("")
    }

    pub fn trace_state(&self, at: usize) -> &str {
        std::str::from_utf8(self.spans[at].trace_state.get(&self.bytes)).unwrap_or("")
    }

    pub fn service_name(&self, at: usize) -> &str {
        let origin = &self.origins[self.spans[at].origin as usize];
        std::str::from_utf8(origin.service_name.get(&self.bytes)).unwrap_or("")
    }

    pub fn resource(&self, at: usize) -> &[u8] {
        self.origins[self.spans[at].origin as usize].resource.get(&self.bytes)
    }

    pub fn scope(&self, at: usize) -> &[u8] {
        self.origins[self.spans[at].origin as usize].scope.get(&self.bytes)
    }

    /// The span's bytes as received (a `Span` message).
    pub fn payload(&self, at: usize) -> Vec<u8> {
        let slot = &self.spans[at];
        let (ids, times) = omitted(&self.trace_id, slot);
        let body = slot.body.get(&self.bytes);
        let mut out = Vec::with_capacity(body.len() + ids.len() + times.len());
        match slot.body_form {
            BodyForm::AsReceived => out.extend_from_slice(body),
            BodyForm::WithoutIds => {
                out.extend_from_slice(&ids);
                out.extend_from_slice(body);
            }
            BodyForm::WithoutIdsAndTimes => {
                let end = delimited_len(body).unwrap_or(body.len());
                out.extend_from_slice(&ids);
                out.extend_from_slice(&body[..end]);
                out.extend_from_slice(&times);
                out.extend_from_slice(&body[end..]);
            }
        }
        out
    }

    /// The span's bytes without the fields its slot holds (ids, kind, times), where it was held so:
    /// what readers of attributes, events and status walk.
    pub fn body(&self, at: usize) -> &[u8] {
        self.spans[at].body.get(&self.bytes)
    }

    /// The observation of the span, if an adapter read one.
    pub fn obs(&self, at: usize) -> Option<ObsView<'_>> {
        let slot = &self.spans[at];
        (slot.obs.shape != NO_SHAPE).then_some(ObsView { trace: self, slot: slot.obs })
    }

    /// The span's observation as an owned value (for Python, or a copy elsewhere); `schema` is the
    /// one its fields were declared in.
    pub fn observation(&self, at: usize, schema: &Schema) -> Option<Observation> {
        let view = self.obs(at)?;
        let mut observation = Observation::new(view.shape());
        for (id, value) in view.values_with(schema) {
            observation.values.push((id, value.to_owned()));
        }
        Some(observation)
    }

    /// The last value of attribute `key` of the span (a repeated key: the last, as a map reads it);
    /// `None` for every key of a span whose attributes assembly does not read (`SpanSlot::attrs_kept`).
    pub fn attr(&self, at: usize, key: &str) -> Option<AnyValue<'_>> {
        if !self.spans[at].attrs_kept {
            return None;
        }
        span_attribute(self.body(at), key)
    }

    /// Marks the span's attributes as not read by assembly (see `SpanSlot::attrs_kept`).
    pub fn forget_attrs(&mut self, at: usize) {
        self.spans[at].attrs_kept = false;
    }

    /// The time of the span's first event named one of `names` (0 when none).
    pub fn first_event_ns(&self, at: usize, names: &[String]) -> u64 {
        first_event_ns(self.body(at), names)
    }

    /// The span's buffered ancestors, nearest first; stops at the first one not (yet) here, at a
    /// root, or after `MAX_ANCESTRY` steps.
    pub fn ancestors(&self, at: usize) -> Vec<usize> {
        let mut chain = Vec::new();
        let mut parent = self.spans[at].parent().copied();
        while let Some(id) = parent {
            if chain.len() >= MAX_ANCESTRY {
                break;
            }
            let Some(found) = self.find(&id) else { break };
            chain.push(found);
            parent = self.spans[found].parent().copied();
        }
        chain
    }

    /// Heap bytes the trace holds (its arenas, slots and index), for the memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
            + 8 * self.words.capacity()
            + std::mem::size_of::<SpanSlot>() * self.spans.capacity()
            + std::mem::size_of::<OriginSlot>() * self.origins.capacity()
            + self.index.as_ref().map_or(0, |index| index.capacity() * 24)
    }
}

fn range_word(range: Range32) -> u64 {
    (u64::from(range.at) << 32) | u64::from(range.len)
}

fn word_range(word: u64) -> Range32 {
    Range32 { at: (word >> 32) as u32, len: word as u32 }
}

/// An observation as its trace holds it.
#[derive(Clone, Copy)]
pub struct ObsView<'a> {
    trace: &'a TraceData,
    slot: ObsSlot,
}

impl<'a> ObsView<'a> {
    pub fn shape(&self) -> u16 {
        self.slot.shape
    }

    pub fn has(&self, id: FieldId) -> bool {
        self.slot.mask & (1 << id.0) != 0
    }

    fn word(&self, id: FieldId) -> Option<u64> {
        if !self.has(id) {
            return None;
        }
        let below = (self.slot.mask & ((1u64 << id.0) - 1)).count_ones();
        Some(self.trace.words[(self.slot.at + below) as usize])
    }

    pub fn float(&self, id: FieldId) -> Option<f64> {
        self.word(id).map(f64::from_bits)
    }

    pub fn int(&self, id: FieldId) -> Option<i64> {
        self.word(id).map(|w| w as i64)
    }

    pub fn flag(&self, id: FieldId) -> bool {
        self.word(id).is_some_and(|w| w != 0)
    }

    pub fn text(&self, id: FieldId) -> Option<&'a str> {
        let range = word_range(self.word(id)?);
        std::str::from_utf8(range.get(&self.trace.bytes)).ok()
    }

    pub fn floats(&self, id: FieldId) -> Floats<'a> {
        match self.word(id) {
            Some(word) => Floats::Packed(word_range(word).get(&self.trace.bytes)),
            None => Floats::Slice(&[]),
        }
    }

    pub fn texts(&self, id: FieldId) -> Texts<'a> {
        match self.word(id) {
            Some(word) => Texts::Packed(word_range(word).get(&self.trace.bytes)),
            None => Texts::Owned(&[]),
        }
    }

    /// The field's value given its declared kind (`None` when absent).
    pub fn get(&self, id: FieldId, kind: Kind) -> Option<ValueRef<'a>> {
        self.word(id)?;
        Some(match kind {
            Kind::Float => ValueRef::Float(self.float(id)?),
            Kind::Int => ValueRef::Int(self.int(id)?),
            Kind::Flag => ValueRef::Flag(self.flag(id)),
            Kind::Text => ValueRef::Text(self.text(id)?),
            Kind::Floats => ValueRef::Floats(self.floats(id)),
            Kind::Texts => ValueRef::Texts(self.texts(id)),
        })
    }

    /// Every present field with its value, in field order, read as `schema` (the schema the
    /// observation's fields were declared in) says.
    pub fn values_with(&self, schema: &Schema) -> Vec<(FieldId, ValueRef<'a>)> {
        schema.ids().filter_map(|id| self.get(id, schema.kind(id)).map(|v| (id, v))).collect()
    }
}

// --- span bytes ------------------------------------------------------------------------------------

/// The fields a compact body leaves out before and after the span's name: the ids (trace id, span
/// id, parent id) and kind, start and end, as an OTLP serializer writes them.
fn omitted(trace_id: &TraceId, slot: &SpanSlot) -> (Vec<u8>, Vec<u8>) {
    let mut ids = Vec::with_capacity(38);
    ids.extend_from_slice(&[0x0a, 16]);
    ids.extend_from_slice(trace_id);
    ids.extend_from_slice(&[0x12, 8]);
    ids.extend_from_slice(&slot.span_id);
    if slot.has_parent {
        ids.extend_from_slice(&[0x22, 8]);
        ids.extend_from_slice(&slot.parent_span_id);
    }
    let mut times = Vec::with_capacity(29);
    if slot.kind != 0 {
        times.push(0x30);
        push_varint(&mut times, slot.kind as i64 as u64); // int32: a negative one sign-extended
    }
    if slot.start_unix_ns != 0 {
        times.push(0x39);
        times.extend_from_slice(&slot.start_unix_ns.to_le_bytes());
    }
    if slot.end_unix_ns != 0 {
        times.push(0x41);
        times.extend_from_slice(&slot.end_unix_ns.to_le_bytes());
    }
    (ids, times)
}

/// The body of `payload` held for `slot`: without what `omitted` rebuilds, where the payload holds
/// exactly that at its start (and, after the name, kind and times); else as received.
fn compact_pieces<'a>(trace_id: &TraceId, slot: &SpanSlot, payload: &'a [u8], no_trace_state: bool)
                      -> (BodyForm, [&'a [u8]; 2]) {
    let (ids, times) = omitted(trace_id, slot);
    match payload.strip_prefix(ids.as_slice()) {
        Some(rest) if no_trace_state => {
            let name_end = (rest.first() == Some(&0x2a)).then(|| delimited_len(rest)).flatten();
            match name_end {
                Some(end) if !times.is_empty() && rest[end..].starts_with(&times) => {
                    (BodyForm::WithoutIdsAndTimes, [&rest[..end], &rest[end + times.len()..]])
                }
                _ => (BodyForm::WithoutIds, [rest, &[]]),
            }
        }
        _ => (BodyForm::AsReceived, [payload, &[]]),
    }
}

// --- attribute values as a span's bytes hold them ------------------------------------------------

/// An `AnyValue` as found in a span's bytes (its one value; a value with none is `Empty`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AnyValue<'a> {
    Empty,
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
    /// An array, a key-value list or bytes: the value message's bytes.
    Array(&'a [u8]),
    KvList(&'a [u8]),
    Bytes(&'a [u8]),
}

/// Reads an `AnyValue` message (the last of several oneof fields wins, as upb reads it).
pub fn any_value(bytes: &[u8]) -> AnyValue<'_> {
    let mut reader = Reader::new(bytes, 0, bytes.len());
    let mut found = AnyValue::Empty;
    while !reader.done() {
        let Ok((number, wire_type)) = reader.tag() else { return AnyValue::Empty };
        let read = match (number, wire_type) {
            (1, 2) => reader.delimited().ok().and_then(|(s, e)| utf8(&bytes[s..e]).ok()).map(AnyValue::Str),
            (2, 0) => reader.varint().ok().map(|v| AnyValue::Bool(v != 0)),
            (3, 0) => reader.varint().ok().map(|v| AnyValue::Int(v as i64)),
            (4, 1) => reader.fixed(8).ok().map(|v| AnyValue::Double(f64::from_bits(v))),
            (5, 2) => reader.delimited().ok().map(|(s, e)| AnyValue::Array(&bytes[s..e])),
            (6, 2) => reader.delimited().ok().map(|(s, e)| AnyValue::KvList(&bytes[s..e])),
            (7, 2) => reader.delimited().ok().map(|(s, e)| AnyValue::Bytes(&bytes[s..e])),
            _ => {
                if reader.skip(number, wire_type, 0).is_err() {
                    return AnyValue::Empty;
                }
                continue;
            }
        };
        match read {
            Some(value) => found = value,
            None => return AnyValue::Empty,
        }
    }
    found
}

/// The first element of an array value, if it has one.
pub fn array_first(array: &[u8]) -> Option<AnyValue<'_>> {
    let mut reader = Reader::new(array, 0, array.len());
    while !reader.done() {
        let (number, wire_type) = reader.tag().ok()?;
        if number == 1 && wire_type == 2 {
            let (s, e) = reader.delimited().ok()?;
            return Some(any_value(&array[s..e]));
        }
        reader.skip(number, wire_type, 0).ok()?;
    }
    None
}

/// The last value of attribute `key` in a span's bytes (field 9, `KeyValue`s).
pub fn span_attribute<'a>(span: &'a [u8], key: &str) -> Option<AnyValue<'a>> {
    let mut reader = Reader::new(span, 0, span.len());
    let mut found = None;
    while !reader.done() {
        let (number, wire_type) = reader.tag().ok()?;
        if number != 9 || wire_type != 2 {
            reader.skip(number, wire_type, 0).ok()?;
            continue;
        }
        let (s, e) = reader.delimited().ok()?;
        if entry_key(span, s, e).ok()? != key.as_bytes() {
            continue;
        }
        found = Some(entry_value(&span[s..e]));
    }
    found
}

/// A `KeyValue`'s value (field 2, its last occurrence; `Empty` without one).
pub fn entry_value(entry: &[u8]) -> AnyValue<'_> {
    let mut reader = Reader::new(entry, 0, entry.len());
    let mut value = AnyValue::Empty;
    while !reader.done() {
        let Ok((number, wire_type)) = reader.tag() else { return AnyValue::Empty };
        if number == 2 && wire_type == 2 {
            match reader.delimited() {
                Ok((s, e)) => value = any_value(&entry[s..e]),
                Err(_) => return AnyValue::Empty,
            }
        } else if reader.skip(number, wire_type, 0).is_err() {
            return AnyValue::Empty;
        }
    }
    value
}

/// The time of the first event (field 11) named one of `names`; 0 when none is.
pub fn first_event_ns(span: &[u8], names: &[String]) -> u64 {
    if names.is_empty() {
        return 0;
    }
    let mut reader = Reader::new(span, 0, span.len());
    while !reader.done() {
        let Ok((number, wire_type)) = reader.tag() else { return 0 };
        if number != 11 || wire_type != 2 {
            if reader.skip(number, wire_type, 0).is_err() {
                return 0;
            }
            continue;
        }
        let Ok((s, e)) = reader.delimited() else { return 0 };
        let mut event = Reader::new(span, s, e);
        let (mut time, mut name): (u64, &[u8]) = (0, &[]);
        while !event.done() {
            let Ok((number, wire_type)) = event.tag() else { return 0 };
            match (number, wire_type) {
                (1, 1) => time = event.fixed(8).unwrap_or(0),
                (2, 2) => name = event.delimited().map(|(s, e)| &span[s..e]).unwrap_or(&[]),
                _ => {
                    if event.skip(number, wire_type, 0).is_err() {
                        return 0;
                    }
                }
            }
        }
        if names.iter().any(|n| n.as_bytes() == name) {
            return time;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn span_bytes(trace_id: &TraceId, span_id: &SpanId, parent: Option<&SpanId>, name: &str, kind: i32,
                  start: u64, end: u64, attrs: &[(&str, &str)]) -> Vec<u8> {
        let mut out = vec![0x0a, 16];
        out.extend_from_slice(trace_id);
        out.extend_from_slice(&[0x12, 8]);
        out.extend_from_slice(span_id);
        if let Some(parent) = parent {
            out.extend_from_slice(&[0x22, 8]);
            out.extend_from_slice(parent);
        }
        out.push(0x2a);
        push_varint(&mut out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
        out.push(0x30);
        push_varint(&mut out, kind as u64);
        out.push(0x39);
        out.extend_from_slice(&start.to_le_bytes());
        out.push(0x41);
        out.extend_from_slice(&end.to_le_bytes());
        for (key, value) in attrs {
            let mut any = vec![0x0a];
            push_varint(&mut any, value.len() as u64);
            any.extend_from_slice(value.as_bytes());
            let mut entry = vec![0x0a];
            push_varint(&mut entry, key.len() as u64);
            entry.extend_from_slice(key.as_bytes());
            entry.push(0x12);
            push_varint(&mut entry, any.len() as u64);
            entry.extend_from_slice(&any);
            out.push(0x4a);
            push_varint(&mut out, entry.len() as u64);
            out.extend_from_slice(&entry);
        }
        out
    }

    fn new_span<'a>(payload: &'a [u8], span_id: SpanId, parent: Option<SpanId>, observation: Option<&'a Observation>)
                    -> NewSpan<'a> {
        NewSpan {
            span_id, parent_span_id: parent, kind: SPAN_KIND_SERVER, status_code: 0, start_unix_ns: 10,
            end_unix_ns: 20, payload, trace_state: "", resource: b"r", scope: b"s", service_name: "svc", observation,
            attrs_kept: true,
        }
    }

    #[test]
    fn payload_is_rebuilt_byte_for_byte_in_every_body_form() {
        let trace_id = [7u8; 16];
        let compactable = span_bytes(&trace_id, &[1; 8], Some(&[2; 8]), "llm_request", SPAN_KIND_SERVER, 10, 20,
                                     &[("gen_ai.request.model", "m")]);
        let mut reordered = compactable.clone();
        reordered.rotate_left(18); // ids not first: held as received
        let mut data = TraceData::new(trace_id);
        let a = data.put(&new_span(&compactable, [1; 8], Some([2; 8]), None));
        let b = data.put(&new_span(&reordered, [3; 8], None, None));
        assert_eq!(data.span(a).body_form, BodyForm::WithoutIdsAndTimes);
        assert_eq!(data.payload(a), compactable);
        assert_eq!(data.span(b).body_form, BodyForm::AsReceived);
        assert_eq!(data.payload(b), reordered);
        assert_eq!(data.name(a), "llm_request");
        assert!(data.body(a).len() < compactable.len() - 40);
    }

    #[test]
    fn attributes_are_read_from_the_body_last_occurrence_winning() {
        let trace_id = [7u8; 16];
        let payload = span_bytes(&trace_id, &[1; 8], None, "x", SPAN_KIND_SERVER, 10, 20,
                                 &[("k", "first"), ("other", "o"), ("k", "last")]);
        let mut data = TraceData::new(trace_id);
        let at = data.put(&new_span(&payload, [1; 8], None, None));
        assert_eq!(data.attr(at, "k"), Some(AnyValue::Str("last")));
        assert_eq!(data.attr(at, "other"), Some(AnyValue::Str("o")));
        assert_eq!(data.attr(at, "missing"), None);
    }

    #[test]
    fn observations_are_packed_and_read_back_by_field() {
        let schema = Schema::new(vec![("ttft_s".into(), Kind::Float), ("prompt_tokens".into(), Kind::Int),
                                      ("response_model".into(), Kind::Text), ("is_error".into(), Kind::Flag),
                                      ("itl_s".into(), Kind::Floats), ("derived".into(), Kind::Texts)]).unwrap();
        let mut observation = Observation::new(3);
        observation.set(schema.id("response_model").unwrap(), Value::Text("tiny-chat".into()));
        observation.set(schema.id("ttft_s").unwrap(), Value::Float(0.25));
        observation.set(schema.id("itl_s").unwrap(), Value::Floats(vec![0.01, 0.02]));
        observation.set(schema.id("derived").unwrap(), Value::Texts(vec!["prefill".into(), "decode".into()]));
        let mut data = TraceData::new([1; 16]);
        let at = data.put(&new_span(b"", [1; 8], None, Some(&observation)));
        let view = data.obs(at).unwrap();
        assert_eq!(view.shape(), 3);
        assert_eq!(view.float(schema.id("ttft_s").unwrap()), Some(0.25));
        assert_eq!(view.int(schema.id("prompt_tokens").unwrap()), None);
        assert_eq!(view.text(schema.id("response_model").unwrap()), Some("tiny-chat"));
        assert!(!view.flag(schema.id("is_error").unwrap()));
        assert_eq!(view.floats(schema.id("itl_s").unwrap()).iter().collect::<Vec<_>>(), vec![0.01, 0.02]);
        assert_eq!(view.texts(schema.id("derived").unwrap()).iter().collect::<Vec<_>>(), vec!["prefill", "decode"]);
        let values = view.values_with(&schema);
        assert_eq!(values.len(), 4);
    }

    #[test]
    fn a_redelivered_span_replaces_its_first_copy_and_the_arena_stays_bounded() {
        let trace_id = [9u8; 16];
        let payload = span_bytes(&trace_id, &[1; 8], None, "x", SPAN_KIND_SERVER, 10, 20, &[("k", &"v".repeat(500))]);
        let mut data = TraceData::new(trace_id);
        for _ in 0..1000 {
            assert_eq!(data.put(&new_span(&payload, [1; 8], None, None)), 0);
        }
        assert_eq!(data.len(), 1);
        assert!(data.bytes.len() < 20 * payload.len(), "arena {} B", data.bytes.len());
        assert_eq!(data.payload(0), payload);
    }

    #[test]
    fn many_spans_are_found_through_the_index_and_ancestors_stop_at_cycles() {
        let mut data = TraceData::new([1; 16]);
        for i in 0..90u8 {
            let parent = if i == 0 { Some([99; 8]) } else { Some([i - 1; 8]) };
            data.put(&new_span(b"", [i; 8], parent, None));
        }
        assert_eq!(data.find(&[50; 8]), Some(50));
        assert_eq!(data.ancestors(10).len(), 10); // stops at span 0, whose parent (99) is not here
        // A cycle: span 99 (added now) is span 0's parent and span 89's child.
        data.put(&new_span(b"", [99; 8], Some([89; 8]), None));
        assert_eq!(data.ancestors(10).len(), MAX_ANCESTRY);
    }

    #[test]
    fn the_first_matching_event_time_is_read() {
        // event: time 5 name "a"; event: time 7 name "first_token"
        let mut span = Vec::new();
        for (time, name) in [(5u64, "a"), (7, "first_token")] {
            let mut event = vec![0x09];
            event.extend_from_slice(&time.to_le_bytes());
            event.push(0x12);
            push_varint(&mut event, name.len() as u64);
            event.extend_from_slice(name.as_bytes());
            span.push(0x5a);
            push_varint(&mut span, event.len() as u64);
            span.extend_from_slice(&event);
        }
        assert_eq!(first_event_ns(&span, &["first_token".into()]), 7);
        assert_eq!(first_event_ns(&span, &["none".into()]), 0);
    }
}
