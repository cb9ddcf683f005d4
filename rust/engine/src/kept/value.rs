//! Attribute values as the kept-trace writer reads, re-encodes and stores them: an `AnyValue`
//! parsed as upb parses it, written back as upb serializes it (the request Python's `kept_trace`
//! makes is serialized from parsed messages, so every value is written in its canonical form, not
//! as received), and shown as the store's JSON (`span_rows.encode_json` of
//! `attributes.any_value_to_python`, i.e. `json.dumps`).

use std::collections::HashMap;

use crate::wire::{push_varint, utf8, Reader, MAX_DEPTH};

use super::Decline;

/// An `AnyValue` as `any_value_to_python` reads it (`Empty`: no value field set). Arrays and maps
/// carry their canonical encoded size, computed once when read (the free-text rule's `ByteSize()`,
/// and the length prefix every enclosing message writes).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value<'a> {
    Empty,
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
    Array(Vec<Value<'a>>, usize),
    KvList(Vec<Entry<'a>>, usize),
    Bytes(&'a [u8]),
}

/// A `KeyValue`: its key ("" when absent) and its value (`None` when the field is absent, which
/// upb keeps apart from an empty `AnyValue`: only a present one is written back).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry<'a> {
    pub key: &'a str,
    pub value: Option<Value<'a>>,
}

pub(crate) fn varint_size(mut value: u64) -> usize {
    let mut size = 1;
    while value >= 0x80 {
        value >>= 7;
        size += 1;
    }
    size
}

/// A length-delimited field of a one-byte tag and `length` bytes.
pub(crate) fn delimited_size(length: usize) -> usize {
    1 + varint_size(length as u64) + length
}

pub(crate) fn put_delimited(out: &mut Vec<u8>, tag: u8, data: &[u8]) {
    out.push(tag);
    push_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// A length-delimited field's tag and length, its `length` bytes to follow.
pub(crate) fn put_header(out: &mut Vec<u8>, tag: u8, length: usize) {
    out.push(tag);
    push_varint(out, length as u64);
}

impl Value<'_> {
    /// Whether `Redaction._removes` takes it for a scalar (`_SCALARS`: none, a number, a bool).
    pub fn is_scalar(&self) -> bool {
        matches!(self, Value::Empty | Value::Bool(_) | Value::Int(_) | Value::Double(_))
    }

    /// `AnyValue.ByteSize()`: its one field as upb writes it (a oneof member is written even when
    /// it holds its type's default).
    pub fn size(&self) -> usize {
        match self {
            Value::Empty => 0,
            Value::Str(text) => delimited_size(text.len()),
            Value::Bytes(bytes) => delimited_size(bytes.len()),
            Value::Bool(_) => 2,
            Value::Int(number) => 1 + varint_size(*number as u64),
            Value::Double(_) => 9,
            Value::Array(_, size) | Value::KvList(_, size) => delimited_size(*size),
        }
    }

    /// The `AnyValue`'s fields as upb serializes them.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Empty => {}
            Value::Str(text) => put_delimited(out, 0x0a, text.as_bytes()),
            Value::Bool(flag) => out.extend_from_slice(&[0x10, u8::from(*flag)]),
            Value::Int(number) => {
                out.push(0x18);
                push_varint(out, *number as u64);
            }
            Value::Double(number) => {
                out.push(0x21);
                out.extend_from_slice(&number.to_le_bytes());
            }
            Value::Array(values, size) => {
                put_header(out, 0x2a, *size);
                for value in values {
                    put_header(out, 0x0a, value.size());
                    value.encode(out);
                }
            }
            Value::KvList(entries, size) => {
                put_header(out, 0x32, *size);
                for entry in entries {
                    put_header(out, 0x0a, entry.size());
                    entry.encode(out);
                }
            }
            Value::Bytes(bytes) => put_delimited(out, 0x3a, bytes),
        }
    }

    /// `encode_json(any_value_to_python(value))` (for a string, an int, a double or a bool, the
    /// value itself, as `attribute_values` takes it).
    pub fn json(&self, out: &mut String) {
        match self {
            Value::Empty => out.push_str("null"),
            Value::Str(text) => json_string(text, out),
            Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
            Value::Int(number) => push_int(*number, out),
            Value::Double(number) => json_float(*number, out),
            Value::Array(values, _) => {
                out.push('[');
                for (index, value) in values.iter().enumerate() {
                    if index > 0 {
                        out.push_str(", ");
                    }
                    value.json(out);
                }
                out.push(']');
            }
            Value::KvList(entries, _) => json_map(entries, out),
            Value::Bytes(bytes) => {
                out.push('"');
                push_hex(bytes, out);
                out.push('"');
            }
        }
    }
}

/// Entries of a map value searched as a list for an earlier one of the same key; more go by a hash map.
const MAP_SCANNED: usize = 16;

/// A map value as the dict `any_value_to_python` makes of it: a repeated key keeps its first
/// position and its last value. Past a few entries the positions are found by key in a map (a
/// list searched per entry is quadratic in a map's entries, which are the sender's).
fn json_map(entries: &[Entry<'_>], out: &mut String) {
    let mut order: Vec<(&str, Option<&Value>)> = Vec::with_capacity(entries.len());
    let mut positions: Option<HashMap<&str, usize>> =
        (entries.len() > MAP_SCANNED).then(|| HashMap::with_capacity(entries.len()));
    for entry in entries {
        let seen = match positions.as_mut() {
            Some(positions) => {
                let next = order.len();
                let at = *positions.entry(entry.key).or_insert(next);
                (at != next).then_some(at)
            }
            None => order.iter().position(|(key, _)| *key == entry.key),
        };
        match seen {
            Some(at) => order[at].1 = entry.value.as_ref(),
            None => order.push((entry.key, entry.value.as_ref())),
        }
    }
    out.push('{');
    for (index, (key, value)) in order.iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        json_string(key, out);
        out.push_str(": ");
        match value {
            Some(value) => value.json(out),
            None => out.push_str("null"),
        }
    }
    out.push('}');
}

impl Entry<'_> {
    /// The `KeyValue`'s size as upb writes it: an empty key is not written, an absent value neither.
    pub fn size(&self) -> usize {
        let key = if self.key.is_empty() { 0 } else { delimited_size(self.key.len()) };
        key + self.value.as_ref().map_or(0, |value| delimited_size(value.size()))
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        if !self.key.is_empty() {
            put_delimited(out, 0x0a, self.key.as_bytes());
        }
        if let Some(value) = &self.value {
            put_header(out, 0x12, value.size());
            value.encode(out);
        }
    }
}

/// An `AnyValue` of at most one value field, each a known one. A second value field (upb keeps
/// the last, merging a message member), a string-table index (`string_value_strindex`) or an
/// unknown field (upb keeps it, and it counts in `ByteSize()`) is Python's to read.
pub(crate) fn read_value(buf: &[u8], start: usize, end: usize, depth: u32) -> Result<Value<'_>, Decline> {
    if depth > MAX_DEPTH {
        return Err(Decline::Malformed);
    }
    let mut reader = Reader::new(buf, start, end);
    let mut value = Value::Empty;
    let mut seen = false;
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        if seen {
            return Err(Decline::ValueShape);
        }
        seen = true;
        value = match (number, wire_type) {
            (1, 2) => {
                let (s, e) = reader.delimited()?;
                Value::Str(utf8(&buf[s..e])?)
            }
            (2, 0) => Value::Bool(reader.varint()? != 0),
            (3, 0) => Value::Int(reader.varint()? as i64),
            (4, 1) => Value::Double(f64::from_bits(reader.fixed(8)?)),
            (5, 2) => {
                let (s, e) = reader.delimited()?;
                let (values, size) = read_elements(buf, s, e, |vs, ve| read_value(buf, vs, ve, depth + 2), Value::size)?;
                Value::Array(values, size)
            }
            (6, 2) => {
                let (s, e) = reader.delimited()?;
                let (entries, size) = read_elements(buf, s, e, |ks, ke| read_entry(buf, ks, ke, depth + 2), Entry::size)?;
                Value::KvList(entries, size)
            }
            (7, 2) => {
                let (s, e) = reader.delimited()?;
                Value::Bytes(&buf[s..e])
            }
            _ => return Err(Decline::ValueShape),
        };
    }
    Ok(value)
}

/// The elements of an `ArrayValue` or a `KeyValueList` (field 1, repeated, and nothing else) and the
/// message's size as upb writes it.
fn read_elements<T>(buf: &[u8], start: usize, end: usize,
                    mut read: impl FnMut(usize, usize) -> Result<T, Decline>, size_of: impl Fn(&T) -> usize)
                    -> Result<(Vec<T>, usize), Decline> {
    let (mut elements, mut size) = (Vec::new(), 0);
    let mut reader = Reader::new(buf, start, end);
    while !reader.done() {
        match reader.tag()? {
            (1, 2) => {
                let (s, e) = reader.delimited()?;
                let element = read(s, e)?;
                size += delimited_size(size_of(&element));
                elements.push(element);
            }
            _ => return Err(Decline::ValueShape),
        }
    }
    Ok((elements, size))
}

/// A `KeyValue` of a key and a value, each at most once, and nothing else (see `read_value`).
pub(crate) fn read_entry(buf: &[u8], start: usize, end: usize, depth: u32) -> Result<Entry<'_>, Decline> {
    if depth > MAX_DEPTH {
        return Err(Decline::Malformed);
    }
    let mut reader = Reader::new(buf, start, end);
    let (mut key, mut value) = (None, None);
    while !reader.done() {
        match reader.tag()? {
            (1, 2) if key.is_none() => {
                let (s, e) = reader.delimited()?;
                key = Some(utf8(&buf[s..e])?);
            }
            (2, 2) if value.is_none() => {
                let (s, e) = reader.delimited()?;
                value = Some(read_value(buf, s, e, depth + 1)?);
            }
            (1 | 2, 2) => return Err(Decline::FieldTwice),
            _ => return Err(Decline::ValueShape),
        }
    }
    Ok(Entry { key: key.unwrap_or(""), value })
}

// --- JSON as `json.dumps` writes it ------------------------------------------------------------------

/// `json.dumps`'s string: ASCII only (`ensure_ascii`), `\uXXXX` for the rest (DEL included), UTF-16
/// pairs past the BMP. Runs of printable ASCII are copied whole.
pub(crate) fn json_string(text: &str, out: &mut String) {
    out.reserve(text.len() + 2);
    out.push('"');
    let bytes = text.as_bytes();
    let (mut at, mut plain_from) = (0, 0);
    while at < bytes.len() {
        let byte = bytes[at];
        if (b' '..=b'~').contains(&byte) && byte != b'"' && byte != b'\\' {
            at += 1;
            continue;
        }
        out.push_str(&text[plain_from..at]);
        let ch = text[at..].chars().next().unwrap_or('\u{fffd}');
        at += ch.len_utf8();
        plain_from = at;
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            _ => {
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    out.push_str("\\u");
                    push_hex(&unit.to_be_bytes(), out);
                }
            }
        }
    }
    out.push_str(&text[plain_from..]);
    out.push('"');
}

/// `json.dumps` of a float: `NaN`, `Infinity`, `-Infinity`, else `float.__repr__`: the shortest
/// digits that read back (`shortest_digits`), positional while the decimal point is within
/// -4 < point <= 16, else `d.ddde+XX`.
pub(crate) fn json_float(number: f64, out: &mut String) {
    if number.is_nan() {
        out.push_str("NaN");
        return;
    }
    if number.is_infinite() {
        out.push_str(if number > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    let mut buffer = [0u8; 48];
    let (digits, point) = shortest_digits(number.abs(), &mut buffer);
    if number.is_sign_negative() {
        out.push('-');
    }
    // The digits are ASCII: each byte is a char.
    let push_digits = |out: &mut String, digits: &[u8]| digits.iter().for_each(|d| out.push(char::from(*d)));
    if point <= -4 || point > 16 {
        let exponent = point - 1;
        push_digits(out, &digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            push_digits(out, &digits[1..]);
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        if exponent.abs() < 10 {
            out.push('0');
        }
        push_int(i64::from(exponent.abs()), out);
    } else if point <= 0 {
        out.push_str("0.");
        for _ in 0..-point {
            out.push('0');
        }
        push_digits(out, digits);
    } else if point as usize >= digits.len() {
        push_digits(out, digits);
        for _ in digits.len()..point as usize {
            out.push('0');
        }
        out.push_str(".0");
    } else {
        push_digits(out, &digits[..point as usize]);
        out.push('.');
        push_digits(out, &digits[point as usize..]);
    }
}

/// The shortest decimal digits that read back to `magnitude` (finite, not negative) and the
/// position of the decimal point after the first `point` of them, as CPython's `repr` (David Gay's
/// `dtoa`, mode 0) gives them. Rust's shortest digits are of the same length and, where one string
/// of that length is nearest, the same; where the double lies exactly halfway between two (its
/// exact expansion is one digit longer, ending in 5), `dtoa` rounds the last digit half to even,
/// and Rust need not: those are decided here from the exact expansion. A double `m / 2^k`
/// (`m` odd) is exactly `m * 5^k` scaled by `10^-k`, counted in a `u128` for `k <= 26`. From
/// `k = 27` on `m * 5^k` has 19 digits or more, never the 18 or fewer a tie of 17 shortest digits
/// needs; an integer (`k <= 0`) is never halfway: it would be `(10a + 5) * 10^t`, a multiple of
/// `2^t` and of no higher power of two, so the doubles around it are at most `2^t` apart while
/// the two decimals it lies between are `5 * 10^t` away, and neither reads back to it.
pub(crate) fn shortest_digits(magnitude: f64, buffer: &mut [u8; 48]) -> (&[u8], i32) {
    use std::io::Write;
    let written = {
        let mut cursor = std::io::Cursor::new(&mut buffer[..]);
        // `{:e}` of an f64 always fits: at most 17 digits, a point, `e` and a 4-character exponent.
        let _ = write!(cursor, "{magnitude:e}");
        cursor.position() as usize
    };
    let at_e = buffer[..written].iter().position(|b| *b == b'e').unwrap_or(written);
    let exponent: i32 = std::str::from_utf8(&buffer[(at_e + 1).min(written)..written])
        .ok().and_then(|text| text.parse().ok()).unwrap_or(0);
    // The mantissa's digits, the point taken out, moved to the buffer's end.
    let mut count = 0;
    let mut digits = [0u8; 24];
    for &byte in buffer[..at_e].iter().filter(|b| **b != b'.') {
        if count < digits.len() {
            digits[count] = byte;
            count += 1;
        }
    }
    let mut point = exponent + 1;
    if let Some((even, even_point)) = halfway_even(magnitude, count) {
        let text = even.to_string();
        let trimmed = text.trim_end_matches('0');
        count = trimmed.len().min(digits.len());
        digits[..count].copy_from_slice(&trimmed.as_bytes()[..count]);
        point = even_point;
    }
    let start = buffer.len() - count;
    buffer[start..].copy_from_slice(&digits[..count]);
    (&buffer[start..], point)
}

/// Where `magnitude` lies exactly halfway between two decimals of `length` digits: the even one of
/// them, and its decimal point's position (see `shortest_digits`).
fn halfway_even(magnitude: f64, length: usize) -> Option<(u128, i32)> {
    let bits = magnitude.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1u64 << 52) - 1);
    let (mut significand, mut exponent) =
        if biased == 0 { (fraction, -1074) } else { (fraction | (1u64 << 52), biased - 1075) };
    if significand == 0 {
        return None;
    }
    let zeros = significand.trailing_zeros();
    significand >>= zeros;
    exponent += zeros as i32;
    if !(-26..0).contains(&exponent) {
        return None;
    }
    let scale = -exponent; // magnitude = exact * 10^-scale
    let exact = u128::from(significand) * 5u128.pow(scale as u32);
    if exact.checked_ilog10()? as usize + 1 != length + 1 {
        return None; // the shortest digits are not one shorter than the exact expansion: no tie
    }
    // Odd times a power of 5: the exact expansion ends in the 5 a tie needs.
    let below = exact / 10;
    let even = if below.is_multiple_of(2) { below } else { below + 1 };
    // even * 10^(1 - scale): its digits' count plus that exponent is the point.
    Some((even, (even.checked_ilog10()? as i32 + 1) + 1 - scale))
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

pub(crate) fn push_hex(bytes: &[u8], out: &mut String) {
    for byte in bytes {
        out.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(HEX_DIGITS[usize::from(byte & 0xf)]));
    }
}

/// `bytes.hex()`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(bytes, &mut out);
    out
}

/// An integer's decimal digits (`int.__repr__`).
pub(crate) fn push_int(number: i64, out: &mut String) {
    let mut buffer = [0u8; 20];
    let mut magnitude = number.unsigned_abs();
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if number < 0 {
        out.push('-');
    }
    buffer[at..].iter().for_each(|d| out.push(char::from(*d)));
}
