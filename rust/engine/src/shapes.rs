//! The shape table (`otel_llm/processor/llm_metrics/adapters/shapes.py`), compiled: which engine
//! shape a span is, and its observation, read from the span's bytes.
//!
//! The table is Python's data (`shapes.declaration()`, compiled by `declaration::shape_table`); this module
//! is its second interpreter beside `adapters/engines.py` `classify`. Every reading either gives
//! exactly what the Python reading gives, or says `Reading::Python`: the span is read by Python
//! (an attribute value Python converts by rules of its own, events Python reads, a shape read by a
//! Python function). A decline is always correct; a guess never is.

use std::collections::HashMap;

use crate::model::{FieldId, Kind, Observation, Schema, ShapeInfo, Value, SPAN_KIND_SERVER, STATUS_CODE_ERROR};
use crate::wire::{utf8, Malformed, Reader};

// --- the table as declared ----------------------------------------------------------------------

/// `shapes.Read`: how one or more fields are read off a span.
#[derive(Clone, Debug, PartialEq)]
pub enum Read {
    Seconds(Vec<String>),
    Milliseconds(Vec<String>),
    Count(Vec<String>),
    Text(Vec<String>),
    FirstText(Vec<String>),
    FinishReason(String),
    RustDuration(String),
    Constant(String),
    BySpanName(Vec<(String, String)>, String),
    TextOrMapped(String, String, Vec<(String, String)>),
    /// (is_error, error_type)
    Error,
    /// (cached_tokens, cache_write_tokens, spec_accepted_tokens, spec_draft_tokens, spec_steps, spec_decode_rejected)
    CacheAndSpec { read_keys: Vec<String>, write_keys: Vec<String>, spec_keys: [String; 3] },
    /// (ttft_s, itl_s)
    TokenEvents,
}

/// `shapes.AFTERWARDS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Afterwards {
    SglangSingleOutput,
    TgiUnfinished,
}

#[derive(Clone, Debug)]
pub struct ShapeDef {
    pub info: ShapeInfo,
    /// (the fields a reading gives, in order; the reading)
    pub reads: Vec<(Vec<FieldId>, Read)>,
    pub afterwards: Vec<Afterwards>,
    pub python_reading: bool,
    pub reads_attributes: bool,
}

/// `shapes.Rule`.
#[derive(Clone, Debug, Default)]
pub struct RuleDef {
    /// The shape (its index), or a refusal (reason).
    pub shape: Option<usize>,
    pub malformed: Option<String>,
    pub kinds: Vec<i32>,
    pub names: Vec<String>,
    pub present: Vec<String>,
    pub absent: Vec<String>,
    pub any_of: Vec<String>,
    pub equals: Vec<(String, String)>,
    pub is_true: Vec<String>,
    pub no_attributes: bool,
    pub has_events: bool,
}

/// `shapes.Candidates`.
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    pub kinds: Vec<i32>,
    pub names: Vec<String>,
    pub contains: Vec<String>,
    pub first_words: Vec<String>,
    pub prefixes: Vec<String>,
}

impl Candidates {
    pub fn matches(&self, kind: i32, name: &str) -> bool {
        if self.kinds.contains(&kind) {
            return true;
        }
        let first_word = name.split(' ').next().unwrap_or("");
        self.names.iter().any(|n| n == name)
            || self.contains.iter().any(|c| name.contains(c.as_str()))
            || self.first_words.iter().any(|w| w == first_word)
            || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

// --- the compiled table ---------------------------------------------------------------------------

/// Field ids the readings of several fields write, looked up by name once.
#[derive(Clone, Copy, Debug)]
struct Known {
    ttft: FieldId,
    decode: FieldId,
    completion: FieldId,
    e2e: FieldId,
    is_error: FieldId,
    error_type: FieldId,
}

pub struct ShapeTable {
    pub schema: Schema,
    pub shapes: Vec<ShapeDef>,
    pub rules: Vec<RuleDef>,
    pub candidates: Candidates,
    known: Known,
}

/// What the table makes of a span.
#[derive(Debug, PartialEq)]
pub enum Reading {
    /// Not a candidate: no shape claims it and its attributes are not kept for assembly.
    NotCandidate,
    /// A candidate no shape claims (its attributes are kept for assembly).
    Unclaimed,
    /// `shape`'s observation; `reads_attributes` false for a shape whose span's attributes are not kept.
    Observed { shape: usize, observation: Observation, reads_attributes: bool },
    /// A candidate a shape claimed and found nothing to observe (TGI's inner spans).
    NoObservation,
    /// The span is refused for this reason (it is passed through, counted).
    Malformed(String),
    /// Read by Python (see the module's doc).
    Python,
}

impl ShapeTable {
    pub fn new(schema: Schema, shapes: Vec<ShapeDef>, rules: Vec<RuleDef>, candidates: Candidates)
               -> Result<ShapeTable, String> {
        let known = Known {
            ttft: schema.require("ttft_s", Kind::Float)?,
            decode: schema.require("decode_s", Kind::Float)?,
            completion: schema.require("completion_tokens", Kind::Int)?,
            e2e: schema.require("e2e_s", Kind::Float)?,
            is_error: schema.require("is_error", Kind::Flag)?,
            error_type: schema.require("error_type", Kind::Text)?,
        };
        if shapes.len() >= u16::MAX as usize {
            return Err("too many shapes".into());
        }
        for rule in &rules {
            if rule.shape.is_some_and(|s| s >= shapes.len()) {
                return Err("a rule names a shape not in the table".into());
            }
        }
        for shape in &shapes {
            for (fields, read) in &shape.reads {
                let expected = read_arity(read);
                if fields.len() != expected {
                    return Err(format!("{}: a reading of {expected} fields given {}", shape.info.adapter, fields.len()));
                }
            }
        }
        Ok(ShapeTable { schema, shapes, rules, candidates, known })
    }

    pub fn infos(&self) -> Vec<ShapeInfo> {
        self.shapes.iter().map(|s| s.info.clone()).collect()
    }

    pub fn shape_by_adapter(&self, adapter: &str) -> Option<usize> {
        self.shapes.iter().position(|s| s.info.adapter == adapter)
    }

    /// `classify` of one span: `attrs` is the caller's scratch (reused from span to span).
    pub fn read<'d>(&self, span: &SpanFacts<'d>, attrs: &mut Attributes<'d>) -> Reading {
        if !self.candidates.matches(span.kind, span.name) {
            return Reading::NotCandidate;
        }
        // A repeated key: the Python path's view keeps the last and buffers re-serialized bytes.
        if span.duplicate_keys {
            return Reading::Python;
        }
        match plain_attributes(span.data, span.start, span.end, attrs) {
            Ok(true) => {}
            Ok(false) | Err(_) => return Reading::Python,
        }
        let Some(rule) = self.rules.iter().find(|rule| rule_matches(rule, span, attrs)) else {
            return Reading::Unclaimed;
        };
        let Some(rule) = RuleOutcome::of(rule) else { return Reading::Python };
        let shape_index = match rule {
            RuleOutcome::Malformed(reason) => return Reading::Malformed(reason.to_owned()),
            RuleOutcome::Shape(index) => index,
        };
        let shape = &self.shapes[shape_index];
        if shape.python_reading {
            return Reading::Python;
        }
        if !shape.reads_attributes {
            return Reading::Observed {
                shape: shape_index, observation: Observation::new(shape_index as u16), reads_attributes: false,
            };
        }
        match self.read_fields(shape_index, shape, span, attrs) {
            Ok(Some(observation)) => Reading::Observed { shape: shape_index, observation, reads_attributes: true },
            Ok(None) => Reading::NoObservation,
            Err(Refusal::Malformed(reason)) => Reading::Malformed(reason.to_owned()),
            Err(Refusal::Python) => Reading::Python,
        }
    }

    fn read_fields(&self, index: usize, shape: &ShapeDef, span: &SpanFacts<'_>, attrs: &Attributes<'_>)
                   -> Result<Option<Observation>, Refusal> {
        let mut observation = Observation::new(index as u16);
        for (fields, read) in &shape.reads {
            let values = read_values(read, span, attrs)?;
            for (field, value) in fields.iter().zip(values) {
                match value {
                    Some(value) => observation.set(*field, value),
                    None => {
                        // Token events absent: the attribute's TTFT stands (`_table_reading`).
                        if !matches!(read, Read::TokenEvents) {
                            observation.values.retain(|(f, _)| f != field);
                        }
                    }
                }
            }
        }
        let known = &self.known;
        for after in &shape.afterwards {
            match after {
                Afterwards::SglangSingleOutput => {
                    let decode = observation.get(known.decode);
                    let completion = observation.get(known.completion);
                    if let (Some(crate::model::ValueRef::Float(d)), Some(crate::model::ValueRef::Int(c))) = (decode, completion) {
                        if d == 0.0 && c > 1 {
                            observation.values.retain(|(f, _)| *f != known.ttft && *f != known.decode);
                        }
                    }
                }
                Afterwards::TgiUnfinished => {
                    if observation.get(known.e2e).is_none() {
                        if observation.get(known.is_error) != Some(crate::model::ValueRef::Flag(true)) {
                            return Ok(None);
                        }
                        let named = matches!(observation.get(known.error_type), Some(crate::model::ValueRef::Text(t)) if !t.is_empty());
                        if !named {
                            observation.set(known.error_type, Value::Text("_OTHER".into()));
                        }
                    }
                }
            }
        }
        Ok(Some(observation))
    }
}

fn read_arity(read: &Read) -> usize {
    match read {
        Read::Error | Read::TokenEvents => 2,
        Read::CacheAndSpec { .. } => 6,
        _ => 1,
    }
}

enum RuleOutcome<'a> {
    Shape(usize),
    Malformed(&'a str),
}

impl<'a> RuleOutcome<'a> {
    fn of(rule: &'a RuleDef) -> Option<RuleOutcome<'a>> {
        match (&rule.shape, &rule.malformed) {
            (Some(shape), None) => Some(RuleOutcome::Shape(*shape)),
            (None, Some(reason)) => Some(RuleOutcome::Malformed(reason)),
            _ => None,
        }
    }
}

/// What a rule and a reading look at besides the attributes.
pub struct SpanFacts<'d> {
    /// The request's bytes and the span's extent in them.
    pub data: &'d [u8],
    pub start: usize,
    pub end: usize,
    pub kind: i32,
    pub name: &'d str,
    pub status_code: i32,
    pub events: usize,
    pub duplicate_keys: bool,
}

fn rule_matches(rule: &RuleDef, span: &SpanFacts<'_>, attrs: &Attributes<'_>) -> bool {
    (rule.kinds.is_empty() || rule.kinds.contains(&span.kind))
        && (rule.names.is_empty() || rule.names.iter().any(|n| n == span.name))
        && rule.present.iter().all(|k| lookup(attrs, k).is_some())
        && !rule.absent.iter().any(|k| lookup(attrs, k).is_some())
        && (rule.any_of.is_empty() || rule.any_of.iter().any(|k| lookup(attrs, k).is_some()))
        && rule.equals.iter().all(|(k, v)| matches!(get_str(attrs, k), Ok(Some(text)) if text == *v))
        && rule.is_true.iter().all(|k| is_true(attrs, k))
        && (!rule.no_attributes || attrs.is_empty())
        && (!rule.has_events || span.events > 0)
}

/// `_is_true`: a true bool, or the string "true" (a value with neither field reads as false).
fn is_true(attrs: &Attributes<'_>, key: &str) -> bool {
    matches!(lookup(attrs, key), Some(AttrValue::Bool(true)) | Some(AttrValue::Str("true")))
}

// --- attribute values as the readings take them ---------------------------------------------------

/// One attribute value as the readings read it (`Other`: an array, a key-value list, bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AttrValue<'a> {
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
    /// An `ArrayValue`'s bytes (read where a reading takes an array's element, as Python does).
    Array(&'a [u8]),
    Other,
}

/// A span's attributes by key, in the order received.
pub type Attributes<'a> = Vec<(&'a [u8], AttrValue<'a>)>;

/// The span's attributes (field 9 entries) into `out` (cleared first), or `false` when one is not a
/// plain single value: no value, two oneof fields, a value message written twice (upb would merge
/// them). `out` is the caller's, reused from span to span.
pub fn plain_attributes<'a>(buf: &'a [u8], start: usize, end: usize, out: &mut Attributes<'a>)
                            -> std::result::Result<bool, Malformed> {
    out.clear();
    let mut span = Reader::new(buf, start, end);
    while !span.done() {
        let (number, wire_type) = span.tag()?;
        if number != 9 || wire_type != 2 {
            span.skip(number, wire_type, 0)?;
            continue;
        }
        let (s, e) = span.delimited()?;
        let mut entry = Reader::new(buf, s, e);
        let mut key: &[u8] = &[];
        let mut value: Option<(usize, usize)> = None;
        while !entry.done() {
            let (number, wire_type) = entry.tag()?;
            match (number, wire_type) {
                (1, 2) => {
                    let (ks, ke) = entry.delimited()?;
                    key = &buf[ks..ke];
                }
                (2, 2) => {
                    if value.is_some() {
                        return Ok(false);
                    }
                    value = Some(entry.delimited()?);
                }
                _ => entry.skip(number, wire_type, 0)?,
            }
        }
        let Some((vs, ve)) = value else { return Ok(false) };
        let mut any = Reader::new(buf, vs, ve);
        let mut found: Option<AttrValue> = None;
        while !any.done() {
            let (number, wire_type) = any.tag()?;
            let read = match (number, wire_type) {
                (1, 2) => {
                    let (a, b) = any.delimited()?;
                    Some(AttrValue::Str(utf8(&buf[a..b])?))
                }
                (2, 0) => Some(AttrValue::Bool(any.varint()? != 0)),
                (3, 0) => Some(AttrValue::Int(any.varint()? as i64)),
                (4, 1) => Some(AttrValue::Double(f64::from_bits(any.fixed(8)?))),
                (5, 2) => {
                    let (a, b) = any.delimited()?;
                    Some(AttrValue::Array(&buf[a..b]))
                }
                (6..=7, 2) => {
                    any.delimited()?;
                    Some(AttrValue::Other)
                }
                (8, 0) => {
                    any.varint()?;
                    Some(AttrValue::Other)
                }
                _ => {
                    any.skip(number, wire_type, 0)?;
                    None
                }
            };
            if read.is_some() {
                if found.is_some() {
                    return Ok(false);
                }
                found = read;
            }
        }
        let Some(found) = found else { return Ok(false) };
        out.push((key, found));
    }
    Ok(true)
}

pub fn lookup<'a>(attrs: &Attributes<'a>, key: &str) -> Option<AttrValue<'a>> {
    attrs.iter().find(|(k, _)| *k == key.as_bytes()).map(|(_, v)| *v)
}

enum Refusal {
    Malformed(&'static str),
    Python,
}

type Step<T> = std::result::Result<T, Refusal>;

/// `get_float`: a double, an int as float, a numeric string (Python's `float()`: only the plain
/// decimal forms are read here, the rest by Python); a bool or a composite value is refused.
fn number(attrs: &Attributes<'_>, key: &str) -> Step<Option<f64>> {
    match lookup(attrs, key) {
        None => Ok(None),
        Some(AttrValue::Double(v)) => Ok(Some(v)),
        Some(AttrValue::Int(v)) => Ok(Some(v as f64)),
        Some(AttrValue::Str(text)) => plain_decimal(text).map(Some).ok_or(Refusal::Python),
        Some(AttrValue::Bool(_)) | Some(AttrValue::Array(_)) | Some(AttrValue::Other) => {
            Err(Refusal::Malformed("non_numeric_latency"))
        }
    }
}

/// `get_int`: an int, a whole finite double, an int string (plain digits here, the rest Python's).
fn integer(attrs: &Attributes<'_>, key: &str) -> Step<Option<i64>> {
    match lookup(attrs, key) {
        None => Ok(None),
        Some(AttrValue::Int(v)) => Ok(Some(v)),
        Some(AttrValue::Double(v)) => {
            if !v.is_finite() || v != v.trunc() {
                return Err(Refusal::Malformed("non_integer_tokens"));
            }
            // `int(v)` of a whole double beyond i64 is a Python int the engine cannot hold.
            if v.abs() >= 9.2e18 {
                return Err(Refusal::Python);
            }
            Ok(Some(v as i64))
        }
        Some(AttrValue::Str(text)) => plain_integer(text).map(Some).ok_or(Refusal::Python),
        Some(AttrValue::Bool(_)) | Some(AttrValue::Array(_)) | Some(AttrValue::Other) => {
            Err(Refusal::Malformed("non_integer_tokens"))
        }
    }
}

/// `get_str`: a string, an int in decimal, a bool as true/false; a double (Python's `repr`) or an
/// array (its first element's) is Python's; a key-value list or bytes have no text.
fn get_str<'a>(attrs: &Attributes<'a>, key: &str) -> Step<Option<std::borrow::Cow<'a, str>>> {
    use std::borrow::Cow;
    match lookup(attrs, key) {
        None => Ok(None),
        Some(AttrValue::Str(v)) => Ok(Some(Cow::Borrowed(v))),
        Some(AttrValue::Int(v)) => Ok(Some(Cow::Owned(v.to_string()))),
        Some(AttrValue::Bool(v)) => Ok(Some(Cow::Borrowed(if v { "true" } else { "false" }))),
        Some(AttrValue::Double(_)) | Some(AttrValue::Array(_)) | Some(AttrValue::Other) => Err(Refusal::Python),
    }
}

/// `[+-]digits[.digits][e[+-]digits]`, or `[+-]?.digits...`: what Python's `float()` and Rust's
/// parser read alike (no whitespace, underscores, inf or nan, which Python reads by its own rules).
fn plain_decimal(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let mut at = 0;
    if matches!(bytes.first(), Some(b'+') | Some(b'-')) {
        at += 1;
    }
    let mut digits = 0;
    while at < bytes.len() && bytes[at].is_ascii_digit() {
        at += 1;
        digits += 1;
    }
    if at < bytes.len() && bytes[at] == b'.' {
        at += 1;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            at += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    if at < bytes.len() && (bytes[at] == b'e' || bytes[at] == b'E') {
        at += 1;
        if matches!(bytes.get(at), Some(b'+') | Some(b'-')) {
            at += 1;
        }
        let exponent_start = at;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            at += 1;
        }
        if at == exponent_start {
            return None;
        }
    }
    if at != bytes.len() {
        return None;
    }
    text.parse().ok()
}

/// `[+-]digits` within i64: what Python's `int()` and Rust's parser read alike.
fn plain_integer(text: &str) -> Option<i64> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn first_present<'a, T>(attrs: &Attributes<'a>, keys: &[String], read: impl Fn(&Attributes<'a>, &str) -> Step<Option<T>>)
                        -> Step<Option<T>> {
    for key in keys {
        if lookup(attrs, key).is_some() {
            return read(attrs, key);
        }
    }
    Ok(None)
}

fn text_value(text: Option<std::borrow::Cow<'_, str>>) -> Option<Value> {
    text.map(|t| Value::Text(t.into_owned()))
}

fn read_values(read: &Read, span: &SpanFacts<'_>, attrs: &Attributes<'_>) -> Step<Vec<Option<Value>>> {
    Ok(match read {
        Read::Seconds(keys) => vec![first_present(attrs, keys, number)?.map(Value::Float)],
        Read::Milliseconds(keys) => vec![first_present(attrs, keys, number)?.map(|v| Value::Float(v / 1000.0))],
        Read::Count(keys) => vec![first_present(attrs, keys, integer)?.map(Value::Int)],
        Read::Text(keys) => vec![text_value(first_present(attrs, keys, get_str)?)],
        Read::FirstText(keys) => {
            let mut found = None;
            for key in keys {
                if lookup(attrs, key).is_some() {
                    if let Some(text) = get_str(attrs, key)? {
                        if !text.is_empty() {
                            found = Some(Value::Text(text.into_owned()));
                            break;
                        }
                    }
                }
            }
            vec![found]
        }
        Read::FinishReason(key) => vec![finish_reason(attrs, key)?.map(Value::Text)],
        Read::RustDuration(key) => vec![match lookup(attrs, key) {
            None => None,
            Some(AttrValue::Str(text)) => Some(Value::Float(rust_duration(text).ok_or(Refusal::Python)?)),
            // `get_str` of an int or a bool is text without a unit: Python refuses it as unparsable.
            Some(AttrValue::Int(_)) | Some(AttrValue::Bool(_)) => return Err(Refusal::Malformed("unparsable_duration")),
            Some(AttrValue::Double(_)) | Some(AttrValue::Array(_)) | Some(AttrValue::Other) => return Err(Refusal::Python),
        }],
        Read::Constant(value) => vec![Some(Value::Text(value.clone()))],
        Read::BySpanName(mapping, default) => {
            let value = mapping.iter().find(|(name, _)| name == span.name).map_or(default, |(_, v)| v);
            vec![Some(Value::Text(value.clone()))]
        }
        Read::TextOrMapped(key, fallback, mapping) => vec![if lookup(attrs, key).is_some() {
            text_value(get_str(attrs, key)?)
        } else if lookup(attrs, fallback).is_some() {
            let text = get_str(attrs, fallback)?.unwrap_or_default();
            mapping.iter().find(|(from, _)| *from == text).map(|(_, to)| Value::Text(to.clone()))
        } else {
            None
        }],
        Read::Error => {
            if span.status_code != STATUS_CODE_ERROR {
                vec![Some(Value::Flag(false)), None]
            } else {
                let declared = get_str(attrs, "error.type")?.filter(|t| !t.is_empty());
                let error_type = match declared {
                    Some(text) => text.into_owned(),
                    // An exception event's type names it (Python reads the events).
                    None if span.events > 0 => return Err(Refusal::Python),
                    None => "_OTHER".to_owned(),
                };
                vec![Some(Value::Flag(true)), Some(Value::Text(error_type))]
            }
        }
        Read::CacheAndSpec { read_keys, write_keys, spec_keys } => {
            let cached = first_present(attrs, read_keys, integer)?;
            let written = first_present(attrs, write_keys, integer)?;
            let mut values = vec![cached.map(Value::Int), written.map(Value::Int), None, None, None, None];
            if spec_keys.iter().any(|k| lookup(attrs, k).is_some()) {
                let accepted = integer(attrs, &spec_keys[0])?;
                let draft = integer(attrs, &spec_keys[1])?;
                let steps = integer(attrs, &spec_keys[2])?;
                match (accepted, draft, steps) {
                    (Some(a), Some(d), Some(s)) if a >= 0 && d >= 0 && s >= 0 && a <= d => {
                        values[2] = Some(Value::Int(a));
                        values[3] = Some(Value::Int(d));
                        values[4] = Some(Value::Int(s));
                    }
                    (Some(_), Some(_), Some(_)) => values[5] = Some(Value::Text("inconsistent_spec_decode".into())),
                    _ => values[5] = Some(Value::Text("incomplete_spec_decode".into())),
                }
            }
            values
        }
        Read::TokenEvents => {
            if span.events > 0 {
                return Err(Refusal::Python); // vLLM's token events are read by Python
            }
            vec![None, None]
        }
    })
}

/// `_finish_reason` for an array value: the first element whose value is a string (upb's reading:
/// of oneof fields written more than once, the last), none when no element is. An element Python
/// would read otherwise than this walk (a value message written twice, which upb merges) is Python's.
fn first_string(array: &[u8]) -> Step<Option<String>> {
    let mut values = Reader::new(array, 0, array.len());
    while !values.done() {
        let (number, wire_type) = values.tag().map_err(|_| Refusal::Python)?;
        if number != 1 || wire_type != 2 {
            values.skip(number, wire_type, 0).map_err(|_| Refusal::Python)?;
            continue;
        }
        let (s, e) = values.delimited().map_err(|_| Refusal::Python)?;
        let mut element = Reader::new(array, s, e);
        let mut last: Option<(u32, usize, usize)> = None;
        while !element.done() {
            let (number, wire_type) = element.tag().map_err(|_| Refusal::Python)?;
            let at = match (number, wire_type) {
                (1 | 5..=7, 2) => {
                    let (a, b) = element.delimited().map_err(|_| Refusal::Python)?;
                    if number != 1 && last.is_some_and(|(n, _, _)| n == number) {
                        return Err(Refusal::Python); // a message value written twice: upb merges it
                    }
                    (a, b)
                }
                (2..=4 | 8, _) => {
                    element.skip(number, wire_type, 0).map_err(|_| Refusal::Python)?;
                    (0, 0)
                }
                _ => {
                    element.skip(number, wire_type, 0).map_err(|_| Refusal::Python)?;
                    continue;
                }
            };
            last = Some((number, at.0, at.1));
        }
        if let Some((1, a, b)) = last {
            return utf8(&array[a..b]).map(|text| Some(text.to_owned())).map_err(|_| Refusal::Python);
        }
    }
    Ok(None)
}

/// `_finish_reason` for a string value: a JSON array of plain strings (the first, or none for `[]`)
/// or a bare reason. Only printable ASCII without escapes is read here, where Python's `strip` and
/// `json.loads` agree with this reading; an array value, an escape, a number in the JSON or any
/// other text is Python's. A number, a bool or a map has no reason.
fn finish_reason(attrs: &Attributes<'_>, key: &str) -> Step<Option<String>> {
    let text = match lookup(attrs, key) {
        None => return Ok(None),
        Some(AttrValue::Str(text)) => text,
        Some(AttrValue::Array(array)) => return first_string(array),
        Some(AttrValue::Other) => return Err(Refusal::Python),
        Some(_) => return Ok(None),
    };
    if text.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
        return Err(Refusal::Python);
    }
    let text = text.trim_matches(' ');
    if !text.starts_with('[') {
        return Ok(if text.is_empty() { None } else { Some(text.to_owned()) });
    }
    let bytes = text.as_bytes();
    let mut pos = 1;
    let skip_spaces = |pos: &mut usize| {
        while *pos < bytes.len() && bytes[*pos] == b' ' {
            *pos += 1;
        }
    };
    let mut items: Vec<&str> = Vec::new();
    skip_spaces(&mut pos);
    if pos < bytes.len() && bytes[pos] == b']' {
        pos += 1;
    } else {
        loop {
            if pos >= bytes.len() || bytes[pos] != b'"' {
                return Err(Refusal::Python);
            }
            let start = pos + 1;
            let mut end = start;
            while end < bytes.len() && bytes[end] != b'"' {
                if bytes[end] == b'\\' {
                    return Err(Refusal::Python);
                }
                end += 1;
            }
            if end >= bytes.len() {
                return Err(Refusal::Python);
            }
            items.push(&text[start..end]);
            pos = end + 1;
            skip_spaces(&mut pos);
            match bytes.get(pos) {
                Some(b',') => {
                    pos += 1;
                    skip_spaces(&mut pos);
                }
                Some(b']') => {
                    pos += 1;
                    break;
                }
                _ => return Err(Refusal::Python),
            }
        }
    }
    if pos != bytes.len() {
        return Err(Refusal::Python);
    }
    Ok(items.first().map(|s| (*s).to_owned()))
}

/// `parse_rust_duration` for the strict form `<digits>[.<digits>]<unit>` (no spaces), which its
/// regular expression reads the same way; any other text is Python's (a refusal, or spaces).
fn rust_duration(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (digits, unit) = text.split_at(split);
    let (whole, fraction) = match digits.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (digits, None),
    };
    if whole.is_empty() || fraction.is_some_and(|f| f.is_empty() || f.contains('.')) {
        return None;
    }
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" | "us" | "μs" => 1e-6,
        "ns" => 1e-9,
        _ => return None,
    };
    let value: f64 = digits.parse().ok()?;
    Some(value * scale)
}

/// The span kinds a server-side first-token event is read for (`digest`: SERVER spans only).
pub fn reads_first_token_event(kind: i32) -> bool {
    kind == SPAN_KIND_SERVER
}

/// A map from adapter name to its shape, for observations Python hands over.
pub fn by_adapter(table: &ShapeTable) -> HashMap<String, usize> {
    table.shapes.iter().enumerate().map(|(i, s)| (s.info.adapter.clone(), i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::push_varint;

    fn attr(key: &str, value: &[u8]) -> Vec<u8> {
        let mut entry = vec![0x0a];
        push_varint(&mut entry, key.len() as u64);
        entry.extend_from_slice(key.as_bytes());
        entry.push(0x12);
        push_varint(&mut entry, value.len() as u64);
        entry.extend_from_slice(value);
        let mut out = vec![0x4a];
        push_varint(&mut out, entry.len() as u64);
        out.extend_from_slice(&entry);
        out
    }

    fn string(text: &str) -> Vec<u8> {
        let mut out = vec![0x0a];
        push_varint(&mut out, text.len() as u64);
        out.extend_from_slice(text.as_bytes());
        out
    }

    fn double(value: f64) -> Vec<u8> {
        let mut out = vec![0x21];
        out.extend_from_slice(&value.to_le_bytes());
        out
    }

    fn int(value: i64) -> Vec<u8> {
        let mut out = vec![0x18];
        push_varint(&mut out, value as u64);
        out
    }

    fn table() -> ShapeTable {
        let schema = Schema::new(vec![
            ("ttft_s".into(), Kind::Float), ("e2e_s".into(), Kind::Float), ("decode_s".into(), Kind::Float),
            ("completion_tokens".into(), Kind::Int), ("is_error".into(), Kind::Flag),
            ("error_type".into(), Kind::Text), ("response_model".into(), Kind::Text),
            ("finish_reason".into(), Kind::Text),
        ]).unwrap();
        let id = |n: &str| schema.id(n).unwrap();
        let shape = ShapeDef {
            info: ShapeInfo { adapter: "eng".into(), engine_kind: "eng".into(), ..ShapeInfo::default() },
            reads: vec![
                (vec![id("is_error"), id("error_type")], Read::Error),
                (vec![id("ttft_s")], Read::Seconds(vec!["ttft".into()])),
                (vec![id("decode_s")], Read::Seconds(vec!["decode".into()])),
                (vec![id("completion_tokens")], Read::Count(vec!["out".into(), "out2".into()])),
                (vec![id("e2e_s")], Read::Seconds(vec!["e2e".into()])),
                (vec![id("response_model")], Read::Text(vec!["model".into()])),
                (vec![id("finish_reason")], Read::FinishReason("finish".into())),
            ],
            afterwards: vec![Afterwards::SglangSingleOutput],
            python_reading: false,
            reads_attributes: true,
        };
        let rules = vec![
            RuleDef { malformed: Some("missing_latency".into()), names: vec!["req".into()], absent: vec!["e2e".into()],
                      ..RuleDef::default() },
            RuleDef { shape: Some(0), present: vec!["e2e".into()], ..RuleDef::default() },
        ];
        let candidates = Candidates { kinds: vec![2, 3], names: vec!["req".into()], ..Candidates::default() };
        ShapeTable::new(schema, vec![shape], rules, candidates).unwrap()
    }

    fn read(table: &ShapeTable, kind: i32, name: &str, status: i32, body: &[u8]) -> Reading {
        let facts = SpanFacts { data: body, start: 0, end: body.len(), kind, name, status_code: status, events: 0,
                                duplicate_keys: false };
        table.read(&facts, &mut Vec::new())
    }

    fn values(reading: Reading) -> Vec<(FieldId, Value)> {
        match reading {
            Reading::Observed { observation, .. } => observation.values,
            other => panic!("not observed: {other:?}"),
        }
    }

    /// An AnyValue holding an array of the given AnyValues.
    fn array(elements: &[Vec<u8>]) -> Vec<u8> {
        let mut inner = Vec::new();
        for element in elements {
            inner.push(0x0a);
            push_varint(&mut inner, element.len() as u64);
            inner.extend_from_slice(element);
        }
        let mut out = vec![0x2a];
        push_varint(&mut out, inner.len() as u64);
        out.extend_from_slice(&inner);
        out
    }

    #[test]
    fn a_finish_reason_array_gives_its_first_string_element_as_python_reads_it() {
        let table = table();
        let id = table.schema.id("finish_reason").unwrap();
        let reason = |value: Vec<u8>| {
            let mut body = attr("e2e", &double(1.0));
            body.extend(attr("finish", &value));
            values(read(&table, 2, "x", 0, &body)).into_iter().find(|(f, _)| *f == id).map(|(_, v)| v)
        };
        assert_eq!(reason(array(&[string("stop"), string("length")])), Some(Value::Text("stop".into())));
        // Not a string element first: Python's loop skips it.
        assert_eq!(reason(array(&[int(3), string("length")])), Some(Value::Text("length".into())));
        assert_eq!(reason(array(&[])), None);
        assert_eq!(reason(array(&[int(3)])), None);
        // A oneof written twice: the last field is the element's value (upb), here an int.
        let mut twice = string("stop");
        twice.extend(int(1));
        assert_eq!(reason(array(&[twice])), None);
    }

    #[test]
    fn rules_decide_in_order_and_fields_are_read_by_their_readings() {
        let table = table();
        assert_eq!(read(&table, 1, "other", 0, &[]), Reading::NotCandidate);
        assert_eq!(read(&table, 2, "x", 0, &attr("k", &string("v"))), Reading::Unclaimed);
        assert_eq!(read(&table, 1, "req", 0, &[]), Reading::Malformed("missing_latency".into()));
        let mut body = attr("e2e", &double(2.0));
        body.extend(attr("ttft", &string("0.25")));
        body.extend(attr("out2", &int(7)));
        body.extend(attr("model", &int(42)));
        body.extend(attr("finish", &string(" [\"stop\", \"length\"] ")));
        let got = values(read(&table, 2, "x", 0, &body));
        let id = |n: &str| table.schema.id(n).unwrap();
        assert!(got.contains(&(id("ttft_s"), Value::Float(0.25))));
        assert!(got.contains(&(id("e2e_s"), Value::Float(2.0))));
        assert!(got.contains(&(id("completion_tokens"), Value::Int(7))));
        assert!(got.contains(&(id("response_model"), Value::Text("42".into()))));
        assert!(got.contains(&(id("finish_reason"), Value::Text("stop".into()))));
        assert!(got.contains(&(id("is_error"), Value::Flag(false))));
        assert!(!got.iter().any(|(f, _)| *f == id("error_type")));
    }

    #[test]
    fn values_python_reads_by_its_own_rules_go_to_python() {
        let table = table();
        for odd in [string("1_000"), string(" 1"), string("inf"), string("nan")] {
            let mut body = attr("e2e", &double(1.0));
            body.extend(attr("ttft", &odd));
            assert_eq!(read(&table, 2, "x", 0, &body), Reading::Python);
        }
        let mut body = attr("e2e", &double(1.0));
        body.extend(attr("model", &double(1.5)));
        assert_eq!(read(&table, 2, "x", 0, &body), Reading::Python);
        let mut body = attr("e2e", &double(1.0));
        body.extend(attr("finish", &string("[\"a\\\"b\"]")));
        assert_eq!(read(&table, 2, "x", 0, &body), Reading::Python);
    }

    #[test]
    fn refusals_name_their_reason() {
        let table = table();
        let mut body = attr("e2e", &double(1.0));
        body.extend(attr("out", &double(2.5)));
        assert_eq!(read(&table, 2, "x", 0, &body), Reading::Malformed("non_integer_tokens".into()));
        let mut body = attr("e2e", &double(1.0));
        body.extend(attr("ttft", &[0x10, 1])); // a bool
        assert_eq!(read(&table, 2, "x", 0, &body), Reading::Malformed("non_numeric_latency".into()));
    }

    #[test]
    fn errors_are_named_and_afterwards_rules_apply() {
        let table = table();
        let id = |n: &str| table.schema.id(n).unwrap();
        let got = values(read(&table, 2, "x", STATUS_CODE_ERROR, &attr("e2e", &double(1.0))));
        assert!(got.contains(&(id("is_error"), Value::Flag(true))));
        assert!(got.contains(&(id("error_type"), Value::Text("_OTHER".into()))));
        let mut body = attr("e2e", &double(1.0));
        body.extend(attr("error.type", &string("Timeout")));
        let got = values(read(&table, 2, "x", STATUS_CODE_ERROR, &body));
        assert!(got.contains(&(id("error_type"), Value::Text("Timeout".into()))));
        // decode 0 with more than one output token: the single-output rule drops ttft and decode.
        let mut body = attr("e2e", &double(1.0));
        body.extend(attr("ttft", &double(0.9)));
        body.extend(attr("decode", &double(0.0)));
        body.extend(attr("out", &int(5)));
        let got = values(read(&table, 2, "x", 0, &body));
        assert!(!got.iter().any(|(f, _)| *f == id("ttft_s") || *f == id("decode_s")));
    }

    #[test]
    fn plain_decimals_and_integers_are_what_python_reads_alike() {
        for (text, value) in [("1", 1.0), ("-2.5", -2.5), (".5", 0.5), ("5.", 5.0), ("1e3", 1000.0), ("+1E-2", 0.01)] {
            assert_eq!(plain_decimal(text), Some(value), "{text}");
        }
        for text in ["", "e3", "1e", "1_0", " 1", "0x10", "inf", "1.2.3"] {
            assert_eq!(plain_decimal(text), None, "{text}");
        }
        assert_eq!(plain_integer("-12"), Some(-12));
        assert_eq!(plain_integer("99999999999999999999"), None);
        assert_eq!(plain_integer("1.0"), None);
    }

    #[test]
    fn rust_durations_in_the_strict_form() {
        assert_eq!(rust_duration("1.5ms"), Some(1.5e-3));
        assert_eq!(rust_duration("2s"), Some(2.0));
        assert_eq!(rust_duration("850µs"), Some(850.0 * 1e-6));
        assert_eq!(rust_duration("1.5 ms"), None);
        assert_eq!(rust_duration("ms"), None);
    }
}
