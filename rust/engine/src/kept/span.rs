//! The messages of a kept trace read as upb parses them and written back as upb serializes them:
//! known fields in field-number order, a field at its type's default left out (a oneof member and
//! a present sub-message excepted), unknown fields (a known number with another wire type
//! included) after them as received, in order. A singular field sent twice is its last value (a
//! sub-message: both merged), an `int32`/`enum` or `uint32` varint its low 32 bits, as upb reads
//! them. `kept_trace` serializes the messages it parsed, so this is the only form Python writes.

use std::borrow::Cow;

use crate::wire::{push_varint, utf8, Reader};

use super::rules::{Rules, Verdict, CLASS};
use super::value::{delimited_size, put_delimited, put_header, read_entry, varint_size, Entry, Value};
use super::{Decline, RedactionCounts};

/// The depth `skip` is given for unknown groups: the bytes were validated at their own depth
/// (`wire::validate`) before they are read here, so this only bounds the recursion.
const DEPTH: u32 = 1;

/// One kept attribute: its value as read, or one the writer set (a reduced URL, a bridge attribute).
#[derive(Debug)]
pub(crate) struct Attr<'a> {
    pub key: &'a str,
    pub shown: Shown<'a>,
}

#[derive(Debug)]
pub(crate) enum Shown<'a> {
    /// As read (`None`: the `KeyValue` had no value field), or a number the writer set.
    Read(Option<Value<'a>>),
    /// Text the writer set (a reduced URL, a bridge attribute).
    Text(Cow<'a, str>),
}

impl Attr<'_> {
    /// The `AnyValue`'s size, if the `KeyValue` has one.
    fn value_size(&self) -> Option<usize> {
        match &self.shown {
            Shown::Read(value) => value.as_ref().map(Value::size),
            Shown::Text(text) => Some(delimited_size(text.len())),
        }
    }

    /// The `KeyValue`'s size.
    pub fn size(&self) -> usize {
        let key = if self.key.is_empty() { 0 } else { delimited_size(self.key.len()) };
        key + self.value_size().map_or(0, delimited_size)
    }

    /// The attribute as a repeated `KeyValue` field `tag` of its message.
    pub fn put(&self, out: &mut Vec<u8>, tag: u8) {
        put_header(out, tag, self.size());
        if !self.key.is_empty() {
            put_delimited(out, 0x0a, self.key.as_bytes());
        }
        let Some(size) = self.value_size() else { return };
        put_header(out, 0x12, size);
        match &self.shown {
            Shown::Read(value) => value.as_ref().map_or((), |value| value.encode(out)),
            Shown::Text(text) => put_delimited(out, 0x0a, text.as_bytes()),
        }
    }

    /// The value as `attribute_values` holds it, in JSON.
    pub fn json(&self, out: &mut String) {
        match &self.shown {
            Shown::Read(None) => out.push_str("null"),
            Shown::Read(Some(value)) => value.json(out),
            Shown::Text(text) => super::value::json_string(text, out),
        }
    }

    /// The text `_redact_status` reduces a status message to when this is the `error.type`
    /// attribute: its string value as kept, "" for any other kind.
    pub fn text(&self) -> &str {
        match &self.shown {
            Shown::Read(Some(Value::Str(text))) => text,
            Shown::Text(text) => text,
            _ => "",
        }
    }
}

/// `Redaction._strip` of a message's attributes: each judged by its key's class and value, removed
/// (counted) or kept (a metadata URL reduced). Keys may repeat: each is judged by itself.
pub(crate) fn strip<'a>(rules: &mut Rules, entries: Vec<Entry<'a>>, limit: usize, counts: &mut RedactionCounts)
                        -> Vec<Attr<'a>> {
    if rules.strips_nothing(limit) {
        return entries.into_iter().map(|e| Attr { key: e.key, shown: Shown::Read(e.value) }).collect();
    }
    let mut kept = Vec::with_capacity(entries.len());
    for entry in entries {
        let class = rules.key_class(entry.key) & CLASS;
        match rules.removes(entry.value.as_ref(), class, limit, counts) {
            Verdict::Keep => kept.push(Attr { key: entry.key, shown: Shown::Read(entry.value) }),
            Verdict::KeepReduced(url) => kept.push(Attr { key: entry.key, shown: Shown::Text(Cow::Owned(url)) }),
            Verdict::Remove => {}
        }
    }
    kept
}

/// An `int32` or `enum` field's varint as upb keeps it: its low 32 bits, signed.
pub(crate) fn int32(value: u64) -> i32 {
    value as u32 as i32
}

/// A `uint32` field's varint as upb keeps it: its low 32 bits.
fn uint32(value: u64) -> u32 {
    value as u32
}

/// An `int32`/`enum` field written: a negative value sign-extended to ten bytes, as protobuf does.
fn put_int32(out: &mut Vec<u8>, tag: u8, value: i32) {
    if value != 0 {
        out.push(tag);
        push_varint(out, i64::from(value) as u64);
    }
}

fn int32_size(value: i32) -> usize {
    if value == 0 { 0 } else { 1 + varint_size(i64::from(value) as u64) }
}

fn put_uint32(out: &mut Vec<u8>, tag: u8, value: u32) {
    if value != 0 {
        out.push(tag);
        push_varint(out, u64::from(value));
    }
}

fn uint32_size(value: u32) -> usize {
    if value == 0 { 0 } else { 1 + varint_size(u64::from(value)) }
}

/// A string or bytes field written unless empty.
fn put_text(out: &mut Vec<u8>, tag: u8, data: &[u8]) {
    if !data.is_empty() {
        put_delimited(out, tag, data);
    }
}

fn text_size(data: &[u8]) -> usize {
    if data.is_empty() { 0 } else { delimited_size(data.len()) }
}

/// A fixed-width field written unless zero (`tag` may take two bytes: field 16's).
fn put_fixed(out: &mut Vec<u8>, tag: &[u8], value: u64, width: usize) {
    if value != 0 {
        out.extend_from_slice(tag);
        out.extend_from_slice(&value.to_le_bytes()[..width]);
    }
}

fn fixed_size(tag: &[u8], value: u64, width: usize) -> usize {
    if value == 0 { 0 } else { tag.len() + width }
}

/// Unknown fields, as received.
fn put_unknown(out: &mut Vec<u8>, buf: &[u8], unknown: &[(usize, usize)]) {
    for &(s, e) in unknown {
        out.extend_from_slice(&buf[s..e]);
    }
}

fn unknown_size(unknown: &[(usize, usize)]) -> usize {
    unknown.iter().map(|(s, e)| e - s).sum()
}

fn attrs_size(attrs: &[Attr<'_>]) -> usize {
    attrs.iter().map(|a| delimited_size(a.size())).sum()
}

/// The unknown field that starts at `field_start`, skipped by `reader`.
fn skip_unknown(reader: &mut Reader<'_>, number: u32, wire_type: u8, field_start: usize,
                unknown: &mut Vec<(usize, usize)>) -> Result<(), Decline> {
    reader.skip(number, wire_type, DEPTH)?;
    unknown.push((field_start, reader.pos));
    Ok(())
}

fn text_field<'a>(reader: &mut Reader<'a>) -> Result<&'a str, Decline> {
    let (s, e) = reader.delimited()?;
    Ok(utf8(&reader.buf[s..e])?)
}

fn bytes_field<'a>(reader: &mut Reader<'a>) -> Result<&'a [u8], Decline> {
    let (s, e) = reader.delimited()?;
    Ok(&reader.buf[s..e])
}

/// The attributes (`KeyValue`s) at these ranges of `buf`.
fn entries<'a>(buf: &'a [u8], ranges: &[(usize, usize)]) -> Result<Vec<Entry<'a>>, Decline> {
    ranges.iter().map(|&(s, e)| read_entry(buf, s, e, 2)).collect()
}

// --- Status -------------------------------------------------------------------------------------------

/// A span's `Status`, present (upb keeps a sub-message's presence, so an empty one is written back).
#[derive(Debug, Default)]
pub(crate) struct Status<'a> {
    pub message: Cow<'a, str>,
    pub code: i32,
    unknown: Vec<(usize, usize)>,
}

impl<'a> Status<'a> {
    /// Reads one occurrence of the field into `self` (a second occurrence merges, as upb parses it).
    fn read(&mut self, buf: &'a [u8], start: usize, end: usize) -> Result<(), Decline> {
        let mut reader = Reader::new(buf, start, end);
        while !reader.done() {
            let field_start = reader.pos;
            match reader.tag()? {
                (2, 2) => self.message = Cow::Borrowed(text_field(&mut reader)?),
                (3, 0) => self.code = int32(reader.varint()?),
                (number, wire_type) => skip_unknown(&mut reader, number, wire_type, field_start, &mut self.unknown)?,
            }
        }
        Ok(())
    }

    fn size(&self) -> usize {
        text_size(self.message.as_bytes()) + int32_size(self.code) + unknown_size(&self.unknown)
    }

    fn put(&self, out: &mut Vec<u8>, buf: &[u8]) {
        put_header(out, 0x7a, self.size());
        put_text(out, 0x12, self.message.as_bytes());
        put_int32(out, 0x18, self.code);
        put_unknown(out, buf, &self.unknown);
    }
}

// --- Span ------------------------------------------------------------------------------------------

/// A `Span` as upb parses it; its attributes, events and links as the ranges of their messages.
#[derive(Debug, Default)]
pub(crate) struct SpanParts<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub trace_state: Cow<'a, str>,
    pub parent_span_id: &'a [u8],
    pub name: &'a str,
    pub kind: i32,
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<(usize, usize)>,
    dropped_attributes: u32,
    pub events: Vec<(usize, usize)>,
    dropped_events: u32,
    pub links: Vec<(usize, usize)>,
    dropped_links: u32,
    pub status: Option<Status<'a>>,
    flags: u32,
    unknown: Vec<(usize, usize)>,
}

/// Reads a span's bytes (validated: `wire::validate` accepted them as a `Span`).
pub(crate) fn read_span(buf: &[u8]) -> Result<SpanParts<'_>, Decline> {
    let mut parts = SpanParts::default();
    let mut reader = Reader::new(buf, 0, buf.len());
    while !reader.done() {
        let field_start = reader.pos;
        match reader.tag()? {
            (1, 2) => parts.trace_id = bytes_field(&mut reader)?,
            (2, 2) => parts.span_id = bytes_field(&mut reader)?,
            (3, 2) => parts.trace_state = Cow::Borrowed(text_field(&mut reader)?),
            (4, 2) => parts.parent_span_id = bytes_field(&mut reader)?,
            (5, 2) => parts.name = text_field(&mut reader)?,
            (6, 0) => parts.kind = int32(reader.varint()?),
            (7, 1) => parts.start = reader.fixed(8)?,
            (8, 1) => parts.end = reader.fixed(8)?,
            (9, 2) => parts.attributes.push(reader.delimited()?),
            (10, 0) => parts.dropped_attributes = uint32(reader.varint()?),
            (11, 2) => parts.events.push(reader.delimited()?),
            (12, 0) => parts.dropped_events = uint32(reader.varint()?),
            (13, 2) => parts.links.push(reader.delimited()?),
            (14, 0) => parts.dropped_links = uint32(reader.varint()?),
            (15, 2) => {
                let (s, e) = reader.delimited()?;
                parts.status.get_or_insert_with(Status::default).read(buf, s, e)?;
            }
            (16, 5) => parts.flags = reader.fixed(4)? as u32,
            (number, wire_type) => skip_unknown(&mut reader, number, wire_type, field_start, &mut parts.unknown)?,
        }
    }
    Ok(parts)
}

impl<'a> SpanParts<'a> {
    /// The span's attributes, each read (`read_entry`'s declines).
    pub fn entries(&self, buf: &'a [u8]) -> Result<Vec<Entry<'a>>, Decline> {
        entries(buf, &self.attributes)
    }

    /// The span written, its attributes `attrs`, its events and links the messages at `children`'
    /// ranges (their new bytes), as a `ScopeSpans.spans` field.
    pub fn put(&self, out: &mut Vec<u8>, buf: &[u8], attrs: &[Attr<'_>], children: &Children) {
        let size = text_size(self.trace_id) + text_size(self.span_id) + text_size(self.trace_state.as_bytes())
            + text_size(self.parent_span_id) + text_size(self.name.as_bytes()) + int32_size(self.kind)
            + fixed_size(&[0x39], self.start, 8) + fixed_size(&[0x41], self.end, 8) + attrs_size(attrs)
            + uint32_size(self.dropped_attributes) + children.size(&children.events)
            + uint32_size(self.dropped_events) + children.size(&children.links) + uint32_size(self.dropped_links)
            + self.status.as_ref().map_or(0, |status| delimited_size(status.size()))
            + fixed_size(&[0x85, 0x01], u64::from(self.flags), 4) + unknown_size(&self.unknown);
        put_header(out, 0x12, size);
        let start = out.len();
        put_text(out, 0x0a, self.trace_id);
        put_text(out, 0x12, self.span_id);
        put_text(out, 0x1a, self.trace_state.as_bytes());
        put_text(out, 0x22, self.parent_span_id);
        put_text(out, 0x2a, self.name.as_bytes());
        put_int32(out, 0x30, self.kind);
        put_fixed(out, &[0x39], self.start, 8);
        put_fixed(out, &[0x41], self.end, 8);
        for attr in attrs {
            attr.put(out, 0x4a);
        }
        put_uint32(out, 0x50, self.dropped_attributes);
        children.put(out, &children.events, 0x5a);
        put_uint32(out, 0x60, self.dropped_events);
        children.put(out, &children.links, 0x6a);
        put_uint32(out, 0x70, self.dropped_links);
        if let Some(status) = &self.status {
            status.put(out, buf);
        }
        put_fixed(out, &[0x85, 0x01], u64::from(self.flags), 4);
        put_unknown(out, buf, &self.unknown);
        debug_assert_eq!(out.len() - start, size);
    }
}

/// A span's events and links as rewritten: their bytes one after another, each one's range.
#[derive(Debug, Default)]
pub(crate) struct Children {
    bytes: Vec<u8>,
    events: Vec<(usize, usize)>,
    links: Vec<(usize, usize)>,
}

impl Children {
    fn size(&self, ranges: &[(usize, usize)]) -> usize {
        ranges.iter().map(|(s, e)| delimited_size(e - s)).sum()
    }

    fn put(&self, out: &mut Vec<u8>, ranges: &[(usize, usize)], tag: u8) {
        for &(s, e) in ranges {
            put_delimited(out, tag, &self.bytes[s..e]);
        }
    }

    /// The span's events and links through the rules (`Redaction._strip_events_and_links`): a
    /// content event loses its attributes (each counted), another's are stripped; a link's are
    /// stripped under the allowlist only. `limit`: the span's free-text limit.
    pub fn rewrite(rules: &mut Rules, buf: &[u8], parts: &SpanParts<'_>, limit: usize, counts: &mut RedactionCounts)
                   -> Result<Children, Decline> {
        let mut children = Children::default();
        for &(s, e) in &parts.events {
            let at = children.bytes.len();
            rewrite_event(rules, buf, s, e, limit, counts, &mut children.bytes)?;
            children.events.push((at, children.bytes.len()));
        }
        for &(s, e) in &parts.links {
            let at = children.bytes.len();
            rewrite_link(rules, buf, s, e, limit, counts, &mut children.bytes)?;
            children.links.push((at, children.bytes.len()));
        }
        Ok(children)
    }
}

/// An `Event`'s new bytes: time (1), name (2), attributes (3), dropped count (4).
fn rewrite_event(rules: &mut Rules, buf: &[u8], start: usize, end: usize, limit: usize, counts: &mut RedactionCounts,
                 out: &mut Vec<u8>) -> Result<(), Decline> {
    let (mut time, mut name, mut dropped) = (0u64, "", 0u32);
    let (mut ranges, mut unknown) = (Vec::new(), Vec::new());
    let mut reader = Reader::new(buf, start, end);
    while !reader.done() {
        let field_start = reader.pos;
        match reader.tag()? {
            (1, 1) => time = reader.fixed(8)?,
            (2, 2) => name = text_field(&mut reader)?,
            (3, 2) => ranges.push(reader.delimited()?),
            (4, 0) => dropped = uint32(reader.varint()?),
            (number, wire_type) => skip_unknown(&mut reader, number, wire_type, field_start, &mut unknown)?,
        }
    }
    let attrs = if rules.content_event(name) {
        counts.content_events += ranges.len() as u64;
        Vec::new()
    } else {
        strip(rules, entries(buf, &ranges)?, limit, counts)
    };
    put_fixed(out, &[0x09], time, 8);
    put_text(out, 0x12, name.as_bytes());
    for attr in &attrs {
        attr.put(out, 0x1a);
    }
    put_uint32(out, 0x20, dropped);
    put_unknown(out, buf, &unknown);
    Ok(())
}

/// A `Link`'s new bytes: trace id (1), span id (2), trace state (3), attributes (4), dropped count
/// (5), flags (6).
fn rewrite_link(rules: &mut Rules, buf: &[u8], start: usize, end: usize, limit: usize, counts: &mut RedactionCounts,
                out: &mut Vec<u8>) -> Result<(), Decline> {
    let (mut trace_id, mut span_id, mut trace_state): (&[u8], &[u8], &str) = (&[], &[], "");
    let (mut dropped, mut flags) = (0u32, 0u64);
    let (mut ranges, mut unknown) = (Vec::new(), Vec::new());
    let mut reader = Reader::new(buf, start, end);
    while !reader.done() {
        let field_start = reader.pos;
        match reader.tag()? {
            (1, 2) => trace_id = bytes_field(&mut reader)?,
            (2, 2) => span_id = bytes_field(&mut reader)?,
            (3, 2) => trace_state = text_field(&mut reader)?,
            (4, 2) => ranges.push(reader.delimited()?),
            (5, 0) => dropped = uint32(reader.varint()?),
            (6, 5) => flags = reader.fixed(4)?,
            (number, wire_type) => skip_unknown(&mut reader, number, wire_type, field_start, &mut unknown)?,
        }
    }
    let read = entries(buf, &ranges)?;
    let attrs = if rules.allowlist() {
        strip(rules, read, limit, counts)
    } else {
        read.into_iter().map(|e| Attr { key: e.key, shown: Shown::Read(e.value) }).collect()
    };
    put_text(out, 0x0a, trace_id);
    put_text(out, 0x12, span_id);
    put_text(out, 0x1a, trace_state.as_bytes());
    for attr in &attrs {
        attr.put(out, 0x22);
    }
    put_uint32(out, 0x28, dropped);
    put_fixed(out, &[0x35], flags, 4);
    put_unknown(out, buf, &unknown);
    Ok(())
}

// --- Resource and scope -------------------------------------------------------------------------------

/// A `Resource`'s new bytes (`resource_spans.resource.CopyFrom(...)` and `strip_attributes`):
/// attributes (1) through the rules without the free-text one, dropped count (2), entity refs (3).
pub(crate) fn rewrite_resource(rules: &mut Rules, buf: &[u8], counts: &mut RedactionCounts) -> Result<Vec<u8>, Decline> {
    let mut dropped = 0u32;
    let (mut ranges, mut refs, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
    let mut reader = Reader::new(buf, 0, buf.len());
    while !reader.done() {
        let field_start = reader.pos;
        match reader.tag()? {
            (1, 2) => ranges.push(reader.delimited()?),
            (2, 0) => dropped = uint32(reader.varint()?),
            (3, 2) => refs.push(reader.delimited()?),
            (number, wire_type) => skip_unknown(&mut reader, number, wire_type, field_start, &mut unknown)?,
        }
    }
    let attrs = strip(rules, entries(buf, &ranges)?, 0, counts);
    let mut out = Vec::with_capacity(buf.len());
    for attr in &attrs {
        attr.put(&mut out, 0x0a);
    }
    put_uint32(&mut out, 0x10, dropped);
    let mut entity = Vec::new();
    for &(s, e) in &refs {
        entity.clear();
        rewrite_entity_ref(buf, s, e, &mut entity)?;
        put_delimited(&mut out, 0x1a, &entity);
    }
    put_unknown(&mut out, buf, &unknown);
    Ok(out)
}

/// An `EntityRef` as upb writes it back: schema URL (1), type (2), id keys (3), description keys (4).
fn rewrite_entity_ref(buf: &[u8], start: usize, end: usize, out: &mut Vec<u8>) -> Result<(), Decline> {
    let (mut schema_url, mut kind) = ("", "");
    let (mut id_keys, mut description_keys, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
    let mut reader = Reader::new(buf, start, end);
    while !reader.done() {
        let field_start = reader.pos;
        match reader.tag()? {
            (1, 2) => schema_url = text_field(&mut reader)?,
            (2, 2) => kind = text_field(&mut reader)?,
            (3, 2) => id_keys.push(text_field(&mut reader)?),
            (4, 2) => description_keys.push(text_field(&mut reader)?),
            (number, wire_type) => skip_unknown(&mut reader, number, wire_type, field_start, &mut unknown)?,
        }
    }
    put_text(out, 0x0a, schema_url.as_bytes());
    put_text(out, 0x12, kind.as_bytes());
    for key in id_keys {
        put_delimited(out, 0x1a, key.as_bytes()); // a repeated string is written even when empty
    }
    for key in description_keys {
        put_delimited(out, 0x22, key.as_bytes());
    }
    put_unknown(out, buf, &unknown);
    Ok(())
}

/// An `InstrumentationScope`'s new bytes (`scope_spans.scope.CopyFrom(...)` and `strip_attributes`):
/// name (1), version (2), attributes (3), dropped count (4).
pub(crate) fn rewrite_scope(rules: &mut Rules, buf: &[u8], counts: &mut RedactionCounts) -> Result<Vec<u8>, Decline> {
    let (mut name, mut version, mut dropped) = ("", "", 0u32);
    let (mut ranges, mut unknown) = (Vec::new(), Vec::new());
    let mut reader = Reader::new(buf, 0, buf.len());
    while !reader.done() {
        let field_start = reader.pos;
        match reader.tag()? {
            (1, 2) => name = text_field(&mut reader)?,
            (2, 2) => version = text_field(&mut reader)?,
            (3, 2) => ranges.push(reader.delimited()?),
            (4, 0) => dropped = uint32(reader.varint()?),
            (number, wire_type) => skip_unknown(&mut reader, number, wire_type, field_start, &mut unknown)?,
        }
    }
    let attrs = strip(rules, entries(buf, &ranges)?, 0, counts);
    let mut out = Vec::with_capacity(buf.len());
    put_text(&mut out, 0x0a, name.as_bytes());
    put_text(&mut out, 0x12, version.as_bytes());
    for attr in &attrs {
        attr.put(&mut out, 0x1a);
    }
    put_uint32(&mut out, 0x20, dropped);
    put_unknown(&mut out, buf, &unknown);
    Ok(out)
}

/// `service_name_of`: the first `service.name` attribute's string value ("" when absent or not a
/// string), read from the resource as received.
pub(crate) fn service_name(resource: &[u8]) -> Result<String, Decline> {
    let mut reader = Reader::new(resource, 0, resource.len());
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        if (number, wire_type) != (1, 2) {
            reader.skip(number, wire_type, DEPTH)?;
            continue;
        }
        let (s, e) = reader.delimited()?;
        if crate::wire::entry_key(resource, s, e)? != b"service.name" {
            continue; // another attribute: not read, whatever it holds
        }
        let entry = read_entry(resource, s, e, 2)?;
        return Ok(match entry.value {
            Some(Value::Str(text)) => text.to_string(),
            _ => String::new(),
        });
    }
    Ok(String::new())
}
