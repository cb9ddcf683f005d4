//! The OTLP wire: a bounds-checked reader of `ExportTraceServiceRequest` bytes and the walks over it.
//!
//! `ExportTraceServiceRequest` bytes with a bounds-checked reader and returns, per span, the few
//! fields the adapter stage buffers plus the span's own bytes, so no protobuf Python object is
//! built for a span no adapter reads.
//!
//! The walk validates what upb (protobuf's Python backend) validates when the Python path parses
//! the same bytes into `otel_llm.pdata.otlp_view`, so both paths accept and refuse the same
//! input: lengths within their parent, varints of at most 10 bytes, wire types 0-5 with matched
//! groups, field number 1 or more, UTF-8 in every proto3 `string` field the schema knows, and
//! upb's nesting limit. A known field with an unexpected wire type is an unknown field, as in upb.
//! The schema is the installed opentelemetry-proto's (tests/test_native_core.py checks it against
//! the descriptors, so a proto upgrade that adds a field fails the suite rather than drifting).

/// upb's decode depth limit (100 levels below the message parsed) in this walk's counting, where
/// the request is depth 1: measured against upb (tests/test_native_core.py, nested values and groups).
pub const MAX_DEPTH: u32 = 101;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Msg {
    Request,
    ResourceSpans,
    Resource,
    EntityRef,
    ScopeSpans,
    Scope,
    Span,
    AttributesEntry,
    Event,
    Link,
    Status,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Field {
    Str,
    Bytes,
    Varint,
    Fixed64,
    Fixed32,
    Message(Msg),
}

/// The schema: what a field number of a message holds; `None` for a field it does not know.
pub fn field_of(msg: Msg, number: u32) -> Option<Field> {
    use Field::*;
    match (msg, number) {
        (Msg::Request, 1) => Some(Message(Msg::ResourceSpans)),
        (Msg::ResourceSpans, 1) => Some(Message(Msg::Resource)),
        (Msg::ResourceSpans, 2) => Some(Message(Msg::ScopeSpans)),
        (Msg::ResourceSpans, 3) => Some(Str),
        (Msg::Resource, 1) => Some(Message(Msg::KeyValue)),
        (Msg::Resource, 2) => Some(Varint),
        (Msg::Resource, 3) => Some(Message(Msg::EntityRef)),
        (Msg::EntityRef, 1..=4) => Some(Str),
        (Msg::ScopeSpans, 1) => Some(Message(Msg::Scope)),
        (Msg::ScopeSpans, 2) => Some(Message(Msg::Span)),
        (Msg::ScopeSpans, 3) => Some(Str),
        (Msg::Scope, 1 | 2) => Some(Str),
        (Msg::Scope, 3) => Some(Message(Msg::KeyValue)),
        (Msg::Scope, 4) => Some(Varint),
        (Msg::Span, 1 | 2 | 4) => Some(Bytes),
        (Msg::Span, 3 | 5) => Some(Str),
        (Msg::Span, 6 | 10 | 12 | 14) => Some(Varint),
        (Msg::Span, 7 | 8) => Some(Fixed64),
        (Msg::Span, 9) => Some(Message(Msg::AttributesEntry)),
        (Msg::Span, 11) => Some(Message(Msg::Event)),
        (Msg::Span, 13) => Some(Message(Msg::Link)),
        (Msg::Span, 15) => Some(Message(Msg::Status)),
        (Msg::Span, 16) => Some(Fixed32),
        (Msg::AttributesEntry, 1) => Some(Str),
        (Msg::AttributesEntry, 2) => Some(Message(Msg::AnyValue)),
        (Msg::Event, 1) => Some(Fixed64),
        (Msg::Event, 2) => Some(Str),
        (Msg::Event, 3) => Some(Message(Msg::KeyValue)),
        (Msg::Event, 4) => Some(Varint),
        (Msg::Link, 1 | 2) => Some(Bytes),
        (Msg::Link, 3) => Some(Str),
        (Msg::Link, 4) => Some(Message(Msg::KeyValue)),
        (Msg::Link, 5) => Some(Varint),
        (Msg::Link, 6) => Some(Fixed32),
        (Msg::Status, 2) => Some(Str),
        (Msg::Status, 3) => Some(Varint),
        (Msg::KeyValue, 1) => Some(Str),
        (Msg::KeyValue, 2) => Some(Message(Msg::AnyValue)),
        (Msg::KeyValue, 3) => Some(Varint),
        (Msg::AnyValue, 1) => Some(Str),
        (Msg::AnyValue, 2 | 3 | 8) => Some(Varint),
        (Msg::AnyValue, 4) => Some(Fixed64),
        (Msg::AnyValue, 5) => Some(Message(Msg::ArrayValue)),
        (Msg::AnyValue, 6) => Some(Message(Msg::KeyValueList)),
        (Msg::AnyValue, 7) => Some(Bytes),
        (Msg::ArrayValue, 1) => Some(Message(Msg::AnyValue)),
        (Msg::KeyValueList, 1) => Some(Message(Msg::KeyValue)),
        _ => None,
    }
}

pub fn expected_wire_type(field: Field) -> u8 {
    match field {
        Field::Varint => 0,
        Field::Fixed64 => 1,
        Field::Str | Field::Bytes | Field::Message(_) => 2,
        Field::Fixed32 => 5,
    }
}

#[derive(Debug)]
pub struct Malformed(pub &'static str);

pub type Result<T> = std::result::Result<T, Malformed>;

pub struct Reader<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
    pub end: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], start: usize, end: usize) -> Self {
        Reader { buf, pos: start, end }
    }

    #[inline]
    pub fn done(&self) -> bool {
        self.pos >= self.end
    }

    /// Most varints on the wire (tags, lengths, small numbers) are one byte: read inline.
    #[inline]
    pub fn varint(&mut self) -> Result<u64> {
        if self.pos < self.end {
            let byte = self.buf[self.pos];
            if byte & 0x80 == 0 {
                self.pos += 1;
                return Ok(u64::from(byte));
            }
        }
        self.long_varint()
    }

    #[inline(never)]
    fn long_varint(&mut self) -> Result<u64> {
        let mut value: u64 = 0;
        for index in 0..10 {
            if self.pos >= self.end {
                return Err(Malformed("truncated varint"));
            }
            let byte = self.buf[self.pos];
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << (7 * index);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Malformed("varint longer than 10 bytes"))
    }

    #[inline]
    pub fn tag(&mut self) -> Result<(u32, u8)> {
        let tag = self.varint()?;
        if tag > u64::from(u32::MAX) {
            return Err(Malformed("tag over 32 bits"));
        }
        let number = (tag >> 3) as u32;
        if number == 0 {
            return Err(Malformed("field number 0"));
        }
        Ok((number, (tag & 7) as u8))
    }

    #[inline]
    pub fn fixed(&mut self, size: usize) -> Result<u64> {
        if self.end - self.pos < size {
            return Err(Malformed("truncated fixed-width value"));
        }
        let mut value: u64 = 0;
        for (index, byte) in self.buf[self.pos..self.pos + size].iter().enumerate() {
            value |= u64::from(*byte) << (8 * index);
        }
        self.pos += size;
        Ok(value)
    }

    /// A length-delimited field's (start, end) within the buffer.
    #[inline]
    pub fn delimited(&mut self) -> Result<(usize, usize)> {
        let length = self.varint()?;
        let remaining = (self.end - self.pos) as u64;
        if length > remaining {
            return Err(Malformed("length past the end of its message"));
        }
        let start = self.pos;
        self.pos += length as usize;
        Ok((start, self.pos))
    }

    /// Skips an unknown field's value; a group is walked to its matching end.
    pub fn skip(&mut self, number: u32, wire_type: u8, depth: u32) -> Result<()> {
        match wire_type {
            0 => {
                self.varint()?;
            }
            1 => {
                self.fixed(8)?;
            }
            2 => {
                self.delimited()?;
            }
            3 => {
                if depth + 1 > MAX_DEPTH {
                    return Err(Malformed("nested too deeply"));
                }
                loop {
                    if self.done() {
                        return Err(Malformed("unterminated group"));
                    }
                    let (inner, inner_type) = self.tag()?;
                    if inner_type == 4 {
                        if inner != number {
                            return Err(Malformed("mismatched end group"));
                        }
                        break;
                    }
                    self.skip(inner, inner_type, depth + 1)?;
                }
            }
            4 => return Err(Malformed("unexpected end group")),
            5 => {
                self.fixed(4)?;
            }
            _ => return Err(Malformed("invalid wire type")),
        }
        Ok(())
    }
}

/// Validates the message `msg` in `buf[start..end]` and everything in it.
pub fn validate(buf: &[u8], start: usize, end: usize, msg: Msg, depth: u32) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Malformed("nested too deeply"));
    }
    let mut reader = Reader::new(buf, start, end);
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        match field_of(msg, number) {
            Some(field) if expected_wire_type(field) == wire_type => match field {
                Field::Varint => {
                    reader.varint()?;
                }
                Field::Fixed64 => {
                    reader.fixed(8)?;
                }
                Field::Fixed32 => {
                    reader.fixed(4)?;
                }
                Field::Bytes => {
                    reader.delimited()?;
                }
                Field::Str => {
                    let (s, e) = reader.delimited()?;
                    utf8(&buf[s..e])?;
                }
                Field::Message(inner) => {
                    let (s, e) = reader.delimited()?;
                    validate(buf, s, e, inner, depth + 1)?;
                }
            },
            _ => reader.skip(number, wire_type, depth)?,
        }
    }
    Ok(())
}

pub fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|_| Malformed("invalid UTF-8 in a string field"))
}

/// What the adapter stage reads of one span without parsing it in Python.
pub struct SpanRow {
    pub resource_index: usize,
    pub scope_index: usize,
    pub span_index: usize, // within its scope's spans, as the parsed request indexes it
    pub trace_id: (usize, usize),
    pub span_id: (usize, usize),
    pub parent_span_id: (usize, usize),
    pub trace_state: (usize, usize),
    pub name: (usize, usize),
    pub kind: i32,
    pub status_code: i32,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub payload: (usize, usize),
    pub attributes: usize,       // distinct keys, as the view's map counts them
    pub duplicate_keys: bool,    // the view's map keeps the last of each: the Python path's bytes differ
    pub events: usize,
}

/// Distinct keys, as a set: a list scanned per key while there are few (a span's usual dozen or two
/// cost no hash each), a hash set past `DistinctKeys::FEW`, so a span of 250 000 keys costs its keys
/// once each, not once per key before it (a list alone: ~50 s of stalled span processing for one
/// 2.1 MB request). SipHash, Rust's default: the keys are the sender's, and a hash they could
/// collide at will would be the quadratic walk again. `scan` keeps one per request, cleared per
/// span, so neither allocation is made per span; the kept-trace writer one per span, sized for it.
pub struct DistinctKeys<'a> {
    few: Vec<&'a [u8]>,
    many: std::collections::HashSet<&'a [u8]>,
}

impl<'a> DistinctKeys<'a> {
    const FEW: usize = 32;

    /// Room for `keys` keys up to `FEW`: one allocation for a span's usual keys.
    pub fn with_capacity(keys: usize) -> Self {
        DistinctKeys { few: Vec::with_capacity(keys.min(Self::FEW)), many: std::collections::HashSet::new() }
    }

    pub fn clear(&mut self) {
        self.few.clear();
        if !self.many.is_empty() {
            // Not `clear`: it writes the table's whole capacity, a 500 000-key span's for every
            // span after it. A new set costs a span of more than `FEW` keys one allocation.
            self.many = std::collections::HashSet::new();
        }
    }

    /// Whether `key` is new (and now held).
    pub fn insert(&mut self, key: &'a [u8]) -> bool {
        if self.few.len() < Self::FEW {
            if self.few.contains(&key) {
                return false;
            }
            self.few.push(key);
            return true;
        }
        if self.many.is_empty() {
            if self.few.contains(&key) {
                return false;
            }
            self.many.extend(self.few.iter().copied());
        }
        self.many.insert(key)
    }

    pub fn len(&self) -> usize {
        if self.many.is_empty() { self.few.len() } else { self.many.len() }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `keys`: the caller's scratch for the span's attribute keys (one per request, not per span);
/// `validated`: see `scan`.
#[allow(clippy::too_many_arguments)]
pub fn read_span<'a>(buf: &'a [u8], start: usize, end: usize, resource_index: usize, scope_index: usize,
                 span_index: usize, depth: u32, keys: &mut DistinctKeys<'a>, validated: bool) -> Result<SpanRow> {
    if !validated {
        validate(buf, start, end, Msg::Span, depth)?;
    }
    let mut row = SpanRow {
        resource_index,
        scope_index,
        span_index,
        trace_id: (start, start),
        span_id: (start, start),
        parent_span_id: (start, start),
        trace_state: (start, start),
        name: (start, start),
        kind: 0,
        status_code: 0,
        start_unix_ns: 0,
        end_unix_ns: 0,
        payload: (start, end),
        attributes: 0,
        duplicate_keys: false,
        events: 0,
    };
    keys.clear();
    let mut reader = Reader::new(buf, start, end);
    // Validated above: every read below succeeds; `?` stays so a slip is an error, never a panic.
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        let known = field_of(Msg::Span, number).filter(|f| expected_wire_type(*f) == wire_type);
        match (number, known) {
            (1, Some(_)) => row.trace_id = reader.delimited()?,
            (2, Some(_)) => row.span_id = reader.delimited()?,
            (3, Some(_)) => row.trace_state = reader.delimited()?,
            (4, Some(_)) => row.parent_span_id = reader.delimited()?,
            (5, Some(_)) => row.name = reader.delimited()?,
            (6, Some(_)) => row.kind = reader.varint()? as u32 as i32,
            (7, Some(_)) => row.start_unix_ns = reader.fixed(8)?,
            (8, Some(_)) => row.end_unix_ns = reader.fixed(8)?,
            (9, Some(_)) => {
                let (s, e) = reader.delimited()?;
                if !keys.insert(entry_key(buf, s, e)?) {
                    row.duplicate_keys = true;
                }
            }
            (11, Some(_)) => {
                reader.delimited()?;
                row.events += 1;
            }
            (15, Some(_)) => {
                // A repeated message field merges: the last code seen in any occurrence wins.
                let (s, e) = reader.delimited()?;
                let mut status = Reader::new(buf, s, e);
                while !status.done() {
                    let (inner, inner_type) = status.tag()?;
                    if inner == 3 && inner_type == 0 {
                        row.status_code = status.varint()? as u32 as i32;
                    } else {
                        status.skip(inner, inner_type, depth + 1)?;
                    }
                }
            }
            _ => reader.skip(number, wire_type, depth)?,
        }
    }
    row.attributes = keys.len();
    Ok(row)
}

/// A map entry's key: the last field 1 of the entry, "" without one.
pub fn entry_key(buf: &[u8], start: usize, end: usize) -> Result<&[u8]> {
    let mut key: &[u8] = &[];
    let mut reader = Reader::new(buf, start, end);
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        if number == 1 && wire_type == 2 {
            let (s, e) = reader.delimited()?;
            key = &buf[s..e];
        } else {
            reader.skip(number, wire_type, 0)?;
        }
    }
    Ok(key)
}

/// A resource and its scopes, each as its occurrences' bytes concatenated: a message field seen
/// twice merges, and concatenated messages parse as their merge, as upb reads the request.
pub struct Origin {
    pub resource: Vec<u8>,
    pub scopes: Vec<Vec<u8>>,
}

/// The request's origins and spans. `validated`: the receiver process's `span_ids` validated these
/// very bytes already (`Digester.rows`), so the walk of every span, resource and scope `validate`
/// would repeat is left out; reading stays bounds-checked either way.
pub fn scan(buf: &[u8], validated: bool) -> Result<(Vec<Origin>, Vec<SpanRow>)> {
    let mut origins: Vec<Origin> = Vec::new();
    let mut spans: Vec<SpanRow> = Vec::with_capacity(buf.len() / 256);
    let mut keys = DistinctKeys::with_capacity(32);
    let mut request = Reader::new(buf, 0, buf.len());
    while !request.done() {
        let (number, wire_type) = request.tag()?;
        if number != 1 || wire_type != 2 {
            request.skip(number, wire_type, 1)?;
            continue;
        }
        let (rs_start, rs_end) = request.delimited()?;
        let resource_index = origins.len();
        let mut origin = Origin { resource: Vec::new(), scopes: Vec::new() };
        let mut resource_spans = Reader::new(buf, rs_start, rs_end);
        while !resource_spans.done() {
            let (number, wire_type) = resource_spans.tag()?;
            match (number, wire_type) {
                (1, 2) => {
                    let (s, e) = resource_spans.delimited()?;
                    if !validated {
                        validate(buf, s, e, Msg::Resource, 3)?;
                    }
                    origin.resource.extend_from_slice(&buf[s..e]);
                }
                (2, 2) => {
                    let (s, e) = resource_spans.delimited()?;
                    let scope_index = origin.scopes.len();
                    let mut scope_bytes: Vec<u8> = Vec::new();
                    let mut span_index = 0;
                    let mut scope_spans = Reader::new(buf, s, e);
                    while !scope_spans.done() {
                        let (number, wire_type) = scope_spans.tag()?;
                        match (number, wire_type) {
                            (1, 2) => {
                                let (s, e) = scope_spans.delimited()?;
                                if !validated {
                                    validate(buf, s, e, Msg::Scope, 4)?;
                                }
                                scope_bytes.extend_from_slice(&buf[s..e]);
                            }
                            (2, 2) => {
                                let (s, e) = scope_spans.delimited()?;
                                spans.push(read_span(buf, s, e, resource_index, scope_index, span_index, 4, &mut keys,
                                                     validated)?);
                                span_index += 1;
                            }
                            (3, 2) => {
                                let (s, e) = scope_spans.delimited()?;
                                utf8(&buf[s..e])?;
                            }
                            _ => scope_spans.skip(number, wire_type, 3)?,
                        }
                    }
                    origin.scopes.push(scope_bytes);
                }
                (3, 2) => {
                    let (s, e) = resource_spans.delimited()?;
                    utf8(&buf[s..e])?;
                }
                _ => resource_spans.skip(number, wire_type, 2)?,
            }
        }
        origins.push(origin);
    }
    Ok((origins, spans))
}

pub fn push_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The length of the length-delimited field at the start of `data` (tag, length, value), if it is one.
pub fn delimited_len(data: &[u8]) -> Option<usize> {
    let mut length: u64 = 0;
    for (index, byte) in data.iter().enumerate().skip(1).take(10) {
        length |= u64::from(byte & 0x7f) << (7 * (index - 1));
        if byte & 0x80 == 0 {
            let end = (index as u64 + 1).checked_add(length)?;
            return (end <= data.len() as u64).then_some(end as usize);
        }
    }
    None
}

/// Each element of a repeated message field is one occurrence of it; a bytes field's last
/// occurrence is its value; a known field number with another wire type is an unknown field.
pub fn span_ids(buf: &[u8]) -> Result<(u64, u64)> {
    let (mut spans, mut rejected) = (0u64, 0u64);
    each_message(buf, 0, buf.len(), 1, 1, |s, e| {
        each_message(buf, s, e, 2, 2, |s, e| {
            each_message(buf, s, e, 2, 3, |s, e| {
                spans += 1;
                rejected += u64::from(!usable_ids(buf, s, e)?);
                Ok(())
            })
        })
    })?;
    Ok((spans, rejected))
}

/// Calls `each` with the bounds of every occurrence of length-delimited field `number` of the
/// message in `buf[start..end]` (at `depth`), in order; every other field is skipped.
pub fn each_message(buf: &[u8], start: usize, end: usize, number: u32, depth: u32,
                mut each: impl FnMut(usize, usize) -> Result<()>) -> Result<()> {
    let mut reader = Reader::new(buf, start, end);
    while !reader.done() {
        let (field, wire_type) = reader.tag()?;
        if (field, wire_type) == (number, 2) {
            let (s, e) = reader.delimited()?;
            each(s, e)?;
        } else {
            reader.skip(field, wire_type, depth)?;
        }
    }
    Ok(())
}

/// `admission.valid_ids`: a 16-byte trace id and an 8-byte span id, neither all zeros, and a parent
/// id that is empty or 8 bytes.
pub fn usable_ids(buf: &[u8], start: usize, end: usize) -> Result<bool> {
    let (mut trace_id, mut span_id, mut parent): (&[u8], &[u8], &[u8]) = (&[], &[], &[]);
    let mut span = Reader::new(buf, start, end);
    while !span.done() {
        let (number, wire_type) = span.tag()?;
        match (number, wire_type) {
            (1, 2) => trace_id = { let (s, e) = span.delimited()?; &buf[s..e] },
            (2, 2) => span_id = { let (s, e) = span.delimited()?; &buf[s..e] },
            (4, 2) => parent = { let (s, e) = span.delimited()?; &buf[s..e] },
            _ => span.skip(number, wire_type, 4)?,
        }
    }
    Ok(trace_id.len() == 16 && trace_id.iter().any(|b| *b != 0)
        && span_id.len() == 8 && span_id.iter().any(|b| *b != 0)
        && (parent.is_empty() || parent.len() == 8))
}

