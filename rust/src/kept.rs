//! A kept trace as it leaves otel-llm (`processor/redaction/synthesis.py` `kept_trace`), written from
//! the spans' bytes: the redaction's rules on every attribute, the `gen_ai` bridge attributes on
//! each record's span, the synthesized segment spans, the export request's bytes and the store's
//! rows (attributes as the JSON `json.dumps` writes), without a protobuf Python object per span.
//!
//! Python stays the reference: where its reading is not a plain one (a repeated key, a singular
//! field sent twice, an attribute value with fields beyond its one value, a record value of a type
//! the Python path would convert or refuse), the builder declines and the Python path writes the
//! trace, so both give the same request and rows (`tests/unit/redaction/test_kept_trace_native.py`).
//! What a key's class is (allowed, blocked, metadata, ...) is asked of the Python `Redaction` once
//! per key and remembered here, so its globs are Python's `fnmatch`.

use std::collections::HashMap;
use std::sync::Mutex;

use blake2::digest::{Update, VariableOutput};
use blake2::Blake2bVar;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::Row;
use otel_llm_engine::wire::{entry_key, push_varint, utf8, validate, DistinctKeys, Msg, Reader};

// `synthesis.py`'s key classes (`_ALLOWED` ... `_METADATA_URL`), the class bits and the GenAI bit.
const ALLOWED: u8 = 0;
const BLOCKED: u8 = 1;
const NOT_METADATA: u8 = 2;
const METADATA_URL: u8 = 4;
const CLASS: u8 = 0x7;
const GENAI: u8 = 0x8;
const KEY_CACHE_LIMIT: usize = 4096; // as `_KEY_CACHE_LIMIT`: keys are the sender's
const SEGMENT_ATTRIBUTE: &str = "otel_llm.segment";
const SCOPE_NAME: &str = "otel-llm";
const INT64_MAX: u64 = i64::MAX as u64;
const KVLIST_SCANNED: usize = 16; // entries of a map value searched as a list; more go by a hash map

/// Where the Python path reads something this builder does not: it writes the trace instead.
struct Decline;

type Step<T> = std::result::Result<T, Decline>;

impl From<crate::Malformed> for Decline {
    fn from(_: crate::Malformed) -> Self {
        Decline
    }
}

impl From<std::convert::Infallible> for Decline {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl From<PyErr> for Decline {
    fn from(_: PyErr) -> Self {
        Decline
    }
}

/// An `AnyValue` as `any_value_to_python` reads it.
enum Value<'a> {
    Null,
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
    Array(Vec<Value<'a>>),
    KvList(Vec<(&'a str, Option<Value<'a>>)>),
    Bytes(&'a [u8]),
}

impl Value<'_> {
    fn is_scalar(&self) -> bool {
        matches!(self, Value::Null | Value::Bool(_) | Value::Int(_) | Value::Double(_))
    }

    /// `AnyValue.ByteSize()` of the parsed value: its one field as upb writes it.
    fn byte_size(&self) -> usize {
        match self {
            Value::Null => 0,
            Value::Str(text) => delimited_size(text.len()),
            Value::Bytes(bytes) => delimited_size(bytes.len()),
            Value::Bool(_) => 2,
            Value::Int(number) => 1 + varint_size(*number as u64),
            Value::Double(_) => 9,
            Value::Array(values) => delimited_size(values.iter().map(|v| delimited_size(v.byte_size())).sum()),
            Value::KvList(entries) => delimited_size(entries.iter().map(|(key, value)| {
                delimited_size(key_value_size(key, value.as_ref()))
            }).sum()),
        }
    }

    /// `encode_json(any_value_to_python(value))`; a float whose notation Python alone decides declines.
    fn json(&self, out: &mut String) -> Step<()> {
        match self {
            Value::Null => out.push_str("null"),
            Value::Str(text) => json_string(text, out),
            Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
            Value::Int(number) => push_int(*number, out),
            Value::Double(number) => json_float(*number, out)?,
            Value::Array(values) => {
                out.push('[');
                for (index, value) in values.iter().enumerate() {
                    if index > 0 {
                        out.push_str(", ");
                    }
                    value.json(out)?;
                }
                out.push(']');
            }
            Value::KvList(entries) => {
                // A dict: a repeated key keeps its first position and its last value. Past a few
                // entries the positions are found by key in a map: the list searched per entry was
                // quadratic in a map's entries.
                let mut order: Vec<(&str, Option<&Value>)> = Vec::with_capacity(entries.len());
                let mut positions: Option<HashMap<&str, usize>> =
                    (entries.len() > KVLIST_SCANNED).then(|| HashMap::with_capacity(entries.len()));
                for (key, value) in entries {
                    let seen = match positions.as_mut() {
                        Some(positions) => {
                            let next = order.len();
                            let at = *positions.entry(key).or_insert(next);
                            (at != next).then_some(at)
                        }
                        None => order.iter().position(|(seen, _)| seen == key),
                    };
                    match seen {
                        Some(at) => order[at].1 = value.as_ref(),
                        None => order.push((key, value.as_ref())),
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
                        Some(value) => value.json(out)?,
                        None => out.push_str("null"),
                    }
                }
                out.push('}');
            }
            Value::Bytes(bytes) => {
                out.push('"');
                push_hex(bytes, out);
                out.push('"');
            }
        }
        Ok(())
    }
}

fn varint_size(mut value: u64) -> usize {
    let mut size = 1;
    while value >= 0x80 {
        value >>= 7;
        size += 1;
    }
    size
}

/// A length-delimited field of a one-byte tag and `length` bytes.
fn delimited_size(length: usize) -> usize {
    1 + varint_size(length as u64) + length
}

fn key_value_size(key: &str, value: Option<&Value>) -> usize {
    let key_size = if key.is_empty() { 0 } else { delimited_size(key.len()) };
    key_size + value.map_or(0, |v| delimited_size(v.byte_size()))
}

fn put_delimited(out: &mut Vec<u8>, tag: u8, data: &[u8]) {
    out.push(tag);
    push_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// A `KeyValue` field (`tag`) of `key` and an `AnyValue` whose fields are `value`, as upb writes it
/// (an empty key is not written).
fn put_key_value(out: &mut Vec<u8>, tag: u8, key: &str, value: &[u8]) {
    let key_size = if key.is_empty() { 0 } else { delimited_size(key.len()) };
    out.push(tag);
    push_varint(out, (key_size + delimited_size(value.len())) as u64);
    if !key.is_empty() {
        put_delimited(out, 0x0a, key.as_bytes());
    }
    put_delimited(out, 0x12, value);
}

/// An `AnyValue`'s fields for a string.
fn string_value(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 4);
    put_delimited(&mut out, 0x0a, text.as_bytes());
    out
}

/// `json.dumps`'s string: ASCII only (`ensure_ascii`), `\uXXXX` for the rest, UTF-16 pairs past the BMP.
fn json_string(text: &str, out: &mut String) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(ch),
            _ => {
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    out.push_str("\\u");
                    push_hex(&unit.to_be_bytes(), out);
                }
            }
        }
    }
    out.push('"');
}

/// `json.dumps` of a float: `NaN`, `Infinity`, `-Infinity`, else `repr`: the shortest digits that
/// read back, in positional notation when the decimal point is within -4 < point <= 16, else
/// `d.ddde+XX`. Where two strings of that length read back (the double halfway between them), Python
/// takes the even last digit and Rust may not: declined (`ambiguous_shortest`), Python writes it.
fn json_float(number: f64, out: &mut String) -> Step<()> {
    if number.is_nan() {
        out.push_str("NaN");
        return Ok(());
    }
    if number.is_infinite() {
        out.push_str(if number > 0.0 { "Infinity" } else { "-Infinity" });
        return Ok(());
    }
    // Rust's shortest round-trip digits (as repr's), written on the stack: `d.ddde-x`.
    use std::io::Write;
    let mut buffer = [0u8; 40];
    let written = {
        let mut cursor = std::io::Cursor::new(&mut buffer[..]);
        let _ = write!(cursor, "{:e}", number.abs());
        cursor.position() as usize
    };
    let scientific = std::str::from_utf8(&buffer[..written]).unwrap_or("0e0");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let mut digit_buffer = [0u8; 24];
    let mut digit_count = 0;
    for byte in mantissa.bytes().filter(|b| *b != b'.') {
        digit_buffer[digit_count] = byte;
        digit_count += 1;
    }
    let digits = std::str::from_utf8(&digit_buffer[..digit_count]).unwrap_or("0");
    if ambiguous_shortest(number.abs(), &digit_buffer[..digit_count]) {
        return Err(Decline);
    }
    let point = exponent + 1; // digits before the decimal point
    if number.is_sign_negative() {
        out.push('-');
    }
    if point <= -4 || point > 16 {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        if exponent.abs() < 10 {
            out.push('0');
        }
        out.push_str(itoa(i64::from(exponent.abs()), &mut [0u8; 20]));
    } else if point <= 0 {
        out.push_str("0.");
        for _ in 0..-point {
            out.push('0');
        }
        out.push_str(digits);
    } else if point as usize >= digits.len() {
        out.push_str(digits);
        for _ in digits.len()..point as usize {
            out.push('0');
        }
        out.push_str(".0");
    } else {
        out.push_str(&digits[..point as usize]);
        out.push('.');
        out.push_str(&digits[point as usize..]);
    }
    Ok(())
}

/// Whether the double lies exactly halfway between two decimals of the shortest digits' length:
/// its exact expansion is those digits' length plus one, the last a 5. A double with a fraction,
/// `m / 2^k` with `m` odd, is exactly `m * 5^k` digits scaled: counted in integers (formatting the
/// exact expansion cost a third of a kept trace's writing). An integer never is: halfway, it would
/// be `(10a + 5) * 10^t`, a multiple of `2^t` and of no higher power of two, so the doubles around
/// it are at most `2^t` apart, while the two decimals it would lie between are `5 * 10^t` away,
/// more than half that gap: neither reads back to it, and its shortest digits are longer.
fn ambiguous_shortest(magnitude: f64, digits: &[u8]) -> bool {
    let bits = magnitude.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1u64 << 52) - 1);
    let (mut significand, mut exponent) = if biased == 0 { (fraction, -1074) } else { (fraction | (1u64 << 52), biased - 1075) };
    if significand == 0 {
        return false; // zero
    }
    let zeros = significand.trailing_zeros();
    significand >>= zeros;
    exponent += zeros as i32;
    if exponent >= 0 {
        return false; // an integer
    }
    // m * 5^k has at least 19 digits from k = 27 on: never the 18 or fewer a tie needs.
    if exponent < -26 {
        return false;
    }
    // Odd, a multiple of 5: its last digit is the 5 a tie needs.
    let exact = u128::from(significand) * 5u128.pow((-exponent) as u32);
    exact.ilog10() as usize + 1 == digits.len() + 1
}

/// An integer's decimal digits, written in `buffer`.
fn itoa(number: i64, buffer: &mut [u8; 20]) -> &str {
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
        at -= 1;
        buffer[at] = b'-';
    }
    std::str::from_utf8(&buffer[at..]).unwrap_or("0")
}

fn push_int(number: i64, out: &mut String) {
    out.push_str(itoa(number, &mut [0u8; 20]));
}

/// `synthesis.reduced_url`: without userinfo, query and fragment.
fn reduced_url(url: &str) -> String {
    let cut = [url.find('?'), url.find('#')].into_iter().flatten().min().unwrap_or(url.len());
    let url = &url[..cut];
    if let Some(scheme_end) = url.find("://") {
        let authority_start = scheme_end + 3;
        let authority_end = url[authority_start..].find('/').map_or(url.len(), |i| authority_start + i);
        if let Some(at) = url[authority_start..authority_end].rfind('@') {
            return format!("{}{}", &url[..authority_start], &url[authority_start + at + 1..]);
        }
    }
    url.to_string()
}

/// An `AnyValue` of exactly one known field (or none): anything else the Python path reads.
fn read_value(buf: &[u8], start: usize, end: usize) -> Step<Value<'_>> {
    let mut reader = Reader::new(buf, start, end);
    let mut value = Value::Null;
    let mut seen = false;
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        if seen {
            return Err(Decline);
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
                let mut values = Vec::new();
                let mut inner = Reader::new(buf, s, e);
                while !inner.done() {
                    match inner.tag()? {
                        (1, 2) => {
                            let (vs, ve) = inner.delimited()?;
                            values.push(read_value(buf, vs, ve)?);
                        }
                        _ => return Err(Decline),
                    }
                }
                Value::Array(values)
            }
            (6, 2) => {
                let (s, e) = reader.delimited()?;
                let mut entries = Vec::new();
                let mut inner = Reader::new(buf, s, e);
                while !inner.done() {
                    match inner.tag()? {
                        (1, 2) => {
                            let (ks, ke) = inner.delimited()?;
                            let (key, value) = read_key_value(buf, ks, ke)?;
                            entries.push((key, value));
                        }
                        _ => return Err(Decline),
                    }
                }
                Value::KvList(entries)
            }
            (7, 2) => {
                let (s, e) = reader.delimited()?;
                Value::Bytes(&buf[s..e])
            }
            _ => return Err(Decline),
        };
    }
    Ok(value)
}

/// A `KeyValue`'s key ("" when absent) and value (None when absent); a field twice or an unknown
/// field declines.
fn read_key_value(buf: &[u8], start: usize, end: usize) -> Step<(&str, Option<Value<'_>>)> {
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
                value = Some(read_value(buf, s, e)?);
            }
            _ => return Err(Decline),
        }
    }
    Ok((key.unwrap_or(""), value))
}

/// The redaction's rules as `Redaction._removes` states them: whether an attribute of this class
/// and value goes, counted, and a metadata URL's value reduced (`Some` of the new text).
struct Rules {
    allowlist: bool,
    counts: [i64; 5], // content_key, free_text, content_event, not_allowed, url_reduced
}

impl Rules {
    fn removes(&mut self, value: &Value, class: u8, limit: usize) -> (bool, Option<String>) {
        if class == ALLOWED {
            return (false, None);
        }
        if class == BLOCKED {
            self.counts[0] += 1;
            return (true, None);
        }
        let mut reduced = None;
        if self.allowlist && !value.is_scalar() {
            if class == NOT_METADATA {
                self.counts[3] += 1;
                return (true, None);
            }
            if class == METADATA_URL {
                if let Value::Str(text) = value {
                    let url = reduced_url(text);
                    if url != *text {
                        self.counts[4] += 1;
                        reduced = Some(url);
                    }
                }
            }
        }
        if limit > 0 {
            let size = match (&reduced, value) {
                (Some(url), _) => Some(url.len()),
                (None, Value::Str(text)) => Some(text.len()),
                (None, Value::Array(_) | Value::KvList(_) | Value::Bytes(_)) => Some(value.byte_size()),
                _ => None,
            };
            // A string's UTF-8 length is what `_is_free_text`'s two tests come to; else `ByteSize()`.
            if size.is_some_and(|size| size > limit) {
                self.counts[1] += 1;
                return (true, None);
            }
        }
        (false, reduced)
    }
}

/// What a kept attribute shows: its value as read (its index among the span's attributes, its
/// field's bytes as received), a reduced URL, a bridge attribute's value.
enum Shown<'a> {
    Read(usize, &'a [u8]),
    Url(String),
    Owned(&'a OwnedValue),
}

/// A value the builder writes (a reduced URL, the bridge attributes).
enum OwnedValue {
    Str(String),
    Int(i64),
    Double(f64),
}

impl OwnedValue {
    fn json(&self, out: &mut String) -> Step<()> {
        match self {
            OwnedValue::Str(text) => json_string(text, out),
            OwnedValue::Int(number) => push_int(*number, out),
            OwnedValue::Double(number) => json_float(*number, out)?,
        }
        Ok(())
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            OwnedValue::Str(text) => put_delimited(&mut out, 0x0a, text.as_bytes()),
            OwnedValue::Int(number) => {
                out.push(0x18);
                push_varint(&mut out, *number as u64);
            }
            OwnedValue::Double(number) => {
                out.push(0x21);
                out.extend_from_slice(&number.to_le_bytes());
            }
        }
        out
    }
}

/// One kept attribute of a span.
struct Attribute<'a> {
    key: &'a str,
    shown: Shown<'a>,
}

/// A record's bridge attributes (`synthesis.enrich`) and segments, read from the Python record.
struct Enrichment {
    attributes: Vec<(&'static str, OwnedValue)>,
    segments: Vec<(String, u64, u64)>,
}

/// `_Attributes.__setitem__`'s value: a str (or a bool, as `str()` writes it), an int64, a float.
fn settable(value: &Bound<'_, PyAny>) -> Step<OwnedValue> {
    if let Ok(text) = value.downcast_exact::<PyString>() {
        return Ok(OwnedValue::Str(text.to_str()?.to_string()));
    }
    if let Ok(flag) = value.downcast_exact::<PyBool>() {
        return Ok(OwnedValue::Str(if flag.is_true() { "True" } else { "False" }.to_string()));
    }
    if value.downcast_exact::<PyInt>().is_ok() {
        return Ok(OwnedValue::Int(value.extract::<i64>()?));
    }
    if let Ok(number) = value.downcast_exact::<PyFloat>() {
        return Ok(OwnedValue::Double(number.value()));
    }
    Err(Decline)
}

fn exact_str(value: &Bound<'_, PyAny>) -> Step<String> {
    Ok(value.downcast_exact::<PyString>().map_err(|_| Decline)?.to_str()?.to_string())
}

fn joined(value: &Bound<'_, PyAny>) -> Step<Option<String>> {
    let items = value.downcast_exact::<PyTuple>().map_err(|_| Decline)?;
    if items.is_empty() {
        return Ok(None);
    }
    let mut parts = Vec::with_capacity(items.len());
    for item in items.iter() {
        parts.push(exact_str(&item)?);
    }
    Ok(Some(parts.join(",")))
}

/// `enrich`'s attributes and the record's segments; `client` is `Side.CLIENT`, `default` `Source.DEFAULT`.
fn enrichment(py: Python<'_>, record: &Bound<'_, PyAny>, policy: &str, client: &str, default: &str) -> Step<Enrichment> {
    let get = |name: &str| record.getattr(PyString::intern(py, name)).map_err(Decline::from);
    let mut attributes: Vec<(&'static str, OwnedValue)> = Vec::new();
    if !policy.is_empty() {
        attributes.push(("otel_llm.sampling.policy", OwnedValue::Str(policy.to_string())));
    }
    attributes.push(("otel_llm.outcome", settable(&get("outcome")?)?));
    attributes.push(("otel_llm.model_source", settable(&get("model_source")?)?));
    let client = exact_str(&get("side")?)? == client;
    let mut segments = Vec::new();
    if !client {
        let optional = |name: &str| -> Step<Option<OwnedValue>> {
            let value = get(name)?;
            if value.is_none() { Ok(None) } else { Ok(Some(settable(&value)?)) }
        };
        let nonempty = |name: &str| -> Step<Option<OwnedValue>> {
            let text = exact_str(&get(name)?)?;
            Ok((!text.is_empty()).then_some(OwnedValue::Str(text)))
        };
        let mut put = |key: &'static str, value: Option<OwnedValue>| {
            if let Some(value) = value {
                attributes.push((key, value));
            }
        };
        put("gen_ai.usage.input_tokens", optional("prompt_tokens")?);
        put("gen_ai.usage.output_tokens", optional("completion_tokens")?);
        put("gen_ai.provider.name", nonempty("provider_name")?);
        if exact_str(&get("operation_source")?)? != default {
            put("gen_ai.operation.name", Some(settable(&get("operation_name")?)?));
        }
        put("gen_ai.request.model", nonempty("request_model")?);
        put("otel_llm.time_per_output_token", optional("tpot_s")?);
        put("otel_llm.segments_missing", joined(&get("segments_missing")?)?.map(OwnedValue::Str));
        put("otel_llm.segments_derived", joined(&get("segments_derived")?)?.map(OwnedValue::Str));
        put("otel_llm.not_measurable", joined(&get("not_measurable")?)?.map(OwnedValue::Str));
        put("otel_llm.gateway_overhead", optional("gateway_overhead_s")?);
        put("otel_llm.client_overhead", optional("client_overhead_s")?);
    }
    // Segments are written for any side that has them, as `kept_trace` does.
    let listed = get("segments")?;
    let listed = listed.downcast::<PyTuple>().map_err(|_| Decline)?;
    for segment in listed.iter() {
        let segment = segment.downcast::<PyTuple>().map_err(|_| Decline)?;
        if segment.len() != 3 {
            return Err(Decline);
        }
        let name = exact_str(&segment.get_item(0)?)?;
        // Out of uint64: Python raises ValueError, which the Python path raises.
        let start: u64 = segment.get_item(1)?.downcast_exact::<PyInt>().map_err(|_| Decline)?.extract()?;
        let end: u64 = segment.get_item(2)?.downcast_exact::<PyInt>().map_err(|_| Decline)?.extract()?;
        segments.push((name, start, end));
    }
    Ok(Enrichment { attributes, segments })
}

fn segment_span_id(trace_id: &[u8], span_id: &[u8], name: &str) -> [u8; 8] {
    let mut hasher = Blake2bVar::new(8).expect("8 is a valid BLAKE2b output size");
    hasher.update(trace_id);
    hasher.update(span_id);
    hasher.update(name.as_bytes());
    let mut digest = [0u8; 8];
    hasher.finalize_variable(&mut digest).expect("the output is 8 bytes");
    if digest == [0u8; 8] {
        digest[7] = 1; // the all-zero id is invalid
    }
    digest
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

fn push_hex(bytes: &[u8], out: &mut String) {
    for byte in bytes {
        out.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(HEX_DIGITS[usize::from(byte & 0xf)]));
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(bytes, &mut out);
    out
}

/// What the builder wrote of one span: its new bytes and its store row's fields.
struct WrittenSpan {
    bytes: Vec<u8>,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    name: String,
    kind: i32,
    start: u64,
    end: u64,
    status_code: i32,
    status_message: String,
    attributes_json: String,
}

#[pyclass(frozen, module = "otel_llm._core")]
pub struct KeptTraceWriter {
    key_class: PyObject, // `Redaction._key_class`
    status_message_key: String, // `STATUS_MESSAGE_KEY`: the status message is judged as this key's text
    error_type_key: String,     // `ERROR_TYPE_KEY`: what a removed status message is reduced to
    event_names: Vec<String>,
    max_free_text_bytes: usize,
    allowlist: bool,
    client_side: String,
    default_source: String,
    classes: Mutex<HashMap<String, u8>>,
}

impl KeptTraceWriter {
    /// A key's class, asked of Python once. The lock is not held while Python runs: another thread
    /// could take the GIL meanwhile and wait for the lock while holding it.
    fn class_of(&self, py: Python<'_>, key: &str) -> Step<u8> {
        if let Some(class) = self.classes.lock().map_err(|_| Decline)?.get(key) {
            return Ok(*class);
        }
        let class: u8 = self.key_class.bind(py).call1((key,))?.extract()?;
        let mut classes = self.classes.lock().map_err(|_| Decline)?;
        if classes.len() < KEY_CACHE_LIMIT {
            classes.insert(key.to_string(), class);
        }
        Ok(class)
    }

    /// The attributes of an event or a link, stripped (`Redaction._strip`), as their new bytes.
    fn strip(&self, py: Python<'_>, buf: &[u8], entries: &[(usize, usize, usize)], limit: usize, rules: &mut Rules,
             out: &mut Vec<u8>, tag: u8) -> Step<()> {
        for &(field_start, start, end) in entries {
            let (key, value) = read_key_value(buf, start, end)?;
            let shown = value.unwrap_or(Value::Null);
            let class = self.class_of(py, key)? & CLASS;
            let (removed, reduced) = rules.removes(&shown, class, limit);
            if removed {
                continue;
            }
            match reduced {
                Some(url) => put_key_value(out, tag, key, &string_value(&url)),
                None => out.extend_from_slice(&buf[field_start..end]),
            }
        }
        Ok(())
    }

    /// An event, link, resource or scope message rewritten: its attributes (field `attributes_field`)
    /// stripped, or all removed for a content event; a singular field twice declines.
    fn rewrite_child(&self, py: Python<'_>, buf: &[u8], start: usize, end: usize, attributes_field: u32,
                     name_field: Option<u32>, limit: usize, rules: &mut Rules) -> Step<Vec<u8>> {
        let mut reader = Reader::new(buf, start, end);
        let mut out = Vec::with_capacity(end - start);
        let mut entries = Vec::new();
        let mut name: Option<&str> = None;
        let mut seen: u64 = 0;
        while !reader.done() {
            let field_start = reader.pos;
            let (number, wire_type) = reader.tag()?;
            if number == attributes_field && wire_type == 2 {
                let (s, e) = reader.delimited()?;
                entries.push((field_start, s, e));
                continue;
            }
            if number < 64 {
                if seen & (1 << number) != 0 {
                    return Err(Decline);
                }
                seen |= 1 << number;
            } else {
                return Err(Decline);
            }
            if Some(number) == name_field && wire_type == 2 {
                let (s, e) = reader.delimited()?;
                name = Some(utf8(&buf[s..e])?);
            } else {
                reader.skip(number, wire_type, 0)?;
            }
            out.extend_from_slice(&buf[field_start..reader.pos]);
        }
        let name = name.unwrap_or("");
        let content_event = name_field.is_some() && self.event_names.iter().any(|n| n == name);
        if content_event {
            rules.counts[2] += entries.len() as i64;
        } else {
            self.strip(py, buf, &entries, limit, rules, &mut out, (attributes_field << 3 | 2) as u8)?;
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_span<'a>(&self, py: Python<'_>, buf: &'a [u8], trace_state_member: &str, enrichment: Option<&'a Enrichment>,
                  rules: &mut Rules) -> Step<WrittenSpan> {
        validate(buf, 0, buf.len(), Msg::Span, 1)?;
        let mut reader = Reader::new(buf, 0, buf.len());
        // Room for the bridge attributes (~13 of ~40 bytes) and a trace state: one allocation.
        let mut out = Vec::with_capacity(buf.len() + 64 + enrichment.map_or(0, |e| 48 * e.attributes.len()));
        let mut attributes: Vec<(usize, usize, usize)> = Vec::new();
        let mut children: Vec<(usize, usize, usize, u32)> = Vec::new(); // events and links, in place
        let mut seen: u64 = 0;
        let (mut trace_id, mut span_id, mut parent) = (&buf[0..0], &buf[0..0], &buf[0..0]);
        let (mut trace_state, mut name) = ("", "");
        let (mut kind, mut start, mut end) = (0i32, 0u64, 0u64);
        let (mut status_code, mut status_message) = (0i32, "");
        // The output: the fields as received, the attributes (and a new trace state) after them.
        let mut pieces: Vec<std::result::Result<(usize, usize), usize>> = Vec::new(); // Ok: raw range, Err: child index
        let mut status_piece: Option<usize> = None; // where in `pieces` the status is, rewritten if redacted
        while !reader.done() {
            let field_start = reader.pos;
            let (number, wire_type) = reader.tag()?;
            let known_type = match number {
                1..=5 | 9 | 11 | 13 | 15 => 2,
                6 | 10 | 12 | 14 => 0,
                7 | 8 => 1,
                16 => 5,
                _ => 255,
            };
            if known_type != wire_type {
                // An unknown field (or a known one with another wire type): kept as received, as upb keeps it.
                reader.skip(number, wire_type, 0)?;
                pieces.push(Ok((field_start, reader.pos)));
                continue;
            }
            if number == 9 {
                let (s, e) = reader.delimited()?;
                attributes.push((field_start, s, e));
                continue;
            }
            if number == 11 || number == 13 {
                let (s, e) = reader.delimited()?;
                pieces.push(Err(children.len()));
                children.push((field_start, s, e, number));
                continue;
            }
            if seen & (1 << number) != 0 {
                return Err(Decline); // a singular field twice: upb's last-wins (and merge) is Python's to read
            }
            seen |= 1 << number;
            match number {
                1 | 2 | 4 => {
                    let (s, e) = reader.delimited()?;
                    let bytes = &buf[s..e];
                    match number {
                        1 => trace_id = bytes,
                        2 => span_id = bytes,
                        _ => parent = bytes,
                    }
                }
                3 => {
                    let (s, e) = reader.delimited()?;
                    trace_state = utf8(&buf[s..e])?;
                    if !trace_state_member.is_empty() {
                        continue; // rewritten below
                    }
                }
                5 => {
                    let (s, e) = reader.delimited()?;
                    name = utf8(&buf[s..e])?;
                }
                6 => kind = int32(reader.varint()?)?,
                7 => start = reader.fixed(8)?,
                8 => end = reader.fixed(8)?,
                15 => {
                    status_piece = Some(pieces.len());
                    let (s, e) = reader.delimited()?;
                    let mut status = Reader::new(buf, s, e);
                    let mut status_seen = 0u8;
                    while !status.done() {
                        match status.tag()? {
                            (2, 2) if status_seen & 1 == 0 => {
                                status_seen |= 1;
                                let (ms, me) = status.delimited()?;
                                status_message = utf8(&buf[ms..me])?;
                            }
                            (3, 0) if status_seen & 2 == 0 => {
                                status_seen |= 2;
                                status_code = int32(status.varint()?)?;
                            }
                            _ => return Err(Decline),
                        }
                    }
                }
                _ => reader.skip(number, wire_type, 0)?,
            }
            pieces.push(Ok((field_start, reader.pos)));
        }

        // The span's attributes: read, classified, removed or kept (`apply_with_values`).
        let mut read: Vec<(&str, Value, u8)> = Vec::with_capacity(attributes.len());
        let mut distinct = DistinctKeys::with_capacity(attributes.len());
        let mut any_genai = 0u8;
        for &(_, s, e) in &attributes {
            let (key, value) = read_key_value(buf, s, e)?;
            if !distinct.insert(key.as_bytes()) {
                return Err(Decline); // a repeated key: the Python path's `apply_into`
            }
            let class = self.class_of(py, key)?;
            any_genai |= class;
            read.push((key, value.unwrap_or(Value::Null), class & CLASS));
        }
        let limit = if any_genai & GENAI != 0 { self.max_free_text_bytes } else { 0 };
        let mut kept: Vec<Attribute> = Vec::with_capacity(read.len() + 16);
        for (index, (key, value, class)) in read.iter().enumerate() {
            let (removed, reduced) = rules.removes(value, *class, limit);
            if removed {
                continue;
            }
            let (field_start, _, end) = attributes[index];
            kept.push(match reduced {
                Some(url) => Attribute { key, shown: Shown::Url(url) },
                None => Attribute { key, shown: Shown::Read(index, &buf[field_start..end]) },
            });
        }
        // `Status.message` as a text attribute under the status message's key (`_redact_status`):
        // removed, it becomes the span's error.type text as kept, else empty.
        let mut redacted_status: Option<(String, Vec<u8>)> = None; // the new message and Status bytes
        if !status_message.is_empty() {
            let class = self.class_of(py, &self.status_message_key)? & CLASS;
            if rules.removes(&Value::Str(status_message), class, limit).0 {
                let error_type = kept.iter().find(|a| a.key == self.error_type_key).and_then(|a| match &a.shown {
                    Shown::Read(at, _) => match &read[*at].1 {
                        Value::Str(text) => Some(text.to_string()),
                        _ => None,
                    },
                    Shown::Url(url) => Some(url.clone()),
                    Shown::Owned(_) => None,
                }).unwrap_or_default();
                let mut status = Vec::with_capacity(error_type.len() + 16);
                if !error_type.is_empty() {
                    put_delimited(&mut status, 0x12, error_type.as_bytes());
                }
                if status_code != 0 {
                    status.push(0x18);
                    push_varint(&mut status, i64::from(status_code) as u64);
                }
                redacted_status = Some((error_type, status));
            }
        }
        let mut child_bytes = Vec::with_capacity(children.len());
        for &(_, s, e, number) in &children {
            if number == 13 && !self.allowlist {
                child_bytes.push(None); // links are stripped under the allow-list only
                continue;
            }
            let rewritten = if number == 11 {
                self.rewrite_child(py, buf, s, e, 3, Some(2), limit, rules)?
            } else {
                self.rewrite_child(py, buf, s, e, 4, None, limit, rules)?
            };
            child_bytes.push(Some(rewritten));
        }
        if let Some(enrichment) = enrichment {
            for (key, value) in &enrichment.attributes {
                let new = Attribute { key, shown: Shown::Owned(value) };
                match kept.iter_mut().find(|a| a.key == *key) {
                    Some(existing) => *existing = new,
                    None => kept.push(new),
                }
            }
        }

        for (at, piece) in pieces.iter().enumerate() {
            match piece {
                Ok(_) if status_piece == Some(at) && redacted_status.is_some() => {
                    let (_, status) = redacted_status.as_ref().expect("checked in the guard");
                    put_delimited(&mut out, 0x7a, status); // field 15, the span's status
                }
                Ok((s, e)) => out.extend_from_slice(&buf[*s..*e]),
                Err(index) => {
                    let (field_start, _, e, number) = children[*index];
                    match &child_bytes[*index] {
                        None => out.extend_from_slice(&buf[field_start..e]),
                        Some(bytes) => put_delimited(&mut out, (number << 3 | 2) as u8, bytes),
                    }
                }
            }
        }
        if !trace_state_member.is_empty() {
            let mut members = vec![trace_state_member];
            members.extend(trace_state.split(',').filter(|m| !m.is_empty() && !m.starts_with("ot=")));
            put_delimited(&mut out, 0x1a, members.join(",").as_bytes());
        }
        let mut attributes_json = String::with_capacity(48 * kept.len() + 2);
        attributes_json.push('{');
        for (index, attribute) in kept.iter().enumerate() {
            match &attribute.shown {
                Shown::Read(_, raw) => out.extend_from_slice(raw),
                Shown::Url(url) => put_key_value(&mut out, 0x4a, attribute.key, &string_value(url)),
                Shown::Owned(value) => put_key_value(&mut out, 0x4a, attribute.key, &value.encode()),
            }
            if index > 0 {
                attributes_json.push_str(", ");
            }
            json_string(attribute.key, &mut attributes_json);
            attributes_json.push_str(": ");
            match &attribute.shown {
                Shown::Read(at, _) => read[*at].1.json(&mut attributes_json)?,
                Shown::Url(url) => json_string(url, &mut attributes_json),
                Shown::Owned(value) => value.json(&mut attributes_json)?,
            }
        }
        attributes_json.push('}');
        Ok(WrittenSpan {
            bytes: out, trace_id: trace_id.to_vec(), span_id: span_id.to_vec(), parent_span_id: parent.to_vec(),
            name: name.to_string(), kind, start, end, status_code,
            status_message: redacted_status.map_or_else(|| status_message.to_string(), |(message, _)| message),
            attributes_json,
        })
    }
}

/// An `int32` field as upb reads it; one past int32 (a sender's bug) is Python's to read.
fn int32(value: u64) -> Step<i32> {
    i32::try_from(value as i64).map_err(|_| Decline)
}

/// `service_name_of`: the first `service.name` attribute's string value, "" when absent or not a string.
fn service_name(resource: &[u8]) -> Step<String> {
    let mut reader = Reader::new(resource, 0, resource.len());
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        if number == 1 && wire_type == 2 {
            let (s, e) = reader.delimited()?;
            if entry_key(resource, s, e)? != b"service.name" {
                continue; // another attribute: not read, whatever it holds
            }
            let (key, value) = read_key_value(resource, s, e)?;
            if key == "service.name" {
                return Ok(match value {
                    Some(Value::Str(text)) => text.to_string(),
                    _ => String::new(),
                });
            }
        } else {
            reader.skip(number, wire_type, 0)?;
        }
    }
    Ok(String::new())
}

/// A group of the request: one scope's spans, or the segment spans of one resource.
struct Group {
    scope: Vec<u8>, // the ScopeSpans' `scope` message
    spans: Vec<u8>, // ScopeSpans `spans` fields
    rows: Vec<PyObject>,
}

struct ResourceGroup {
    resource: Vec<u8>,
    service_name: String,
    groups: Vec<Group>,
    scopes: HashMap<usize, usize>, // scope object pointer -> its group's index
    synthesized: Option<usize>,
}

#[pymethods]
impl KeptTraceWriter {
    /// `key_class`: the Python `Redaction._key_class`; then `Redaction`'s settings, the values of
    /// `Side.CLIENT` and `Source.DEFAULT` the bridge attributes depend on, and the keys the status
    /// message is judged under and reduced to.
    /// `key_classes`: `synthesis.py`'s (`_ALLOWED`, `_BLOCKED`, `_NOT_METADATA`, `_METADATA_URL`,
    /// `_CLASS`, `_GENAI`), checked against this file's (a drift refuses to make the writer).
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(key_class: PyObject, key_classes: (u8, u8, u8, u8, u8, u8), event_names: Vec<String>,
           max_free_text_bytes: usize, allowlist: bool, client_side: String, default_source: String,
           status_message_key: String, error_type_key: String) -> PyResult<Self> {
        if key_classes != (ALLOWED, BLOCKED, NOT_METADATA, METADATA_URL, CLASS, GENAI) {
            return Err(pyo3::exceptions::PyValueError::new_err("synthesis.py's key classes differ from the core's"));
        }
        Ok(KeptTraceWriter { key_class, status_message_key, error_type_key, event_names, max_free_text_bytes,
                             allowlist, client_side, default_source, classes: Mutex::new(HashMap::new()) })
    }

    /// `kept_trace(spans, records, policy, threshold, redaction)` as `(request bytes, span count, rows,
    /// (content_key, free_text, content_event, not_allowed, url_reduced))`, or None where the Python
    /// path writes the trace (nothing counted then).
    fn build<'py>(&self, py: Python<'py>, spans: &Bound<'py, PyList>, records: &Bound<'py, PyList>, policy: &str,
                  threshold: &str) -> PyResult<PyObject> {
        match self.write(py, spans, records, policy, threshold) {
            Ok(built) => Ok(built.into_any().unbind()),
            Err(Decline) => Ok(py.None()),
        }
    }
}

impl KeptTraceWriter {
    fn write<'py>(&self, py: Python<'py>, spans: &Bound<'py, PyList>, records: &Bound<'py, PyList>, policy: &str,
                  threshold: &str) -> Step<Bound<'py, PyTuple>> {
        // By key in maps, as `kept_trace`'s dicts: lists searched per span made a trace of many
        // records, resources or scopes quadratic in its spans.
        let span_id_key = PyString::intern(py, "span_id");
        let mut by_span: HashMap<Vec<u8>, Bound<'py, PyAny>> = HashMap::with_capacity(records.len());
        for record in records.iter() {
            let id = record.getattr(&span_id_key)?;
            let id = id.downcast_exact::<PyBytes>().map_err(|_| Decline)?.as_bytes().to_vec();
            by_span.insert(id, record); // the last record of a span id, as the dict keeps it
        }
        let member = if threshold.is_empty() || threshold == "0" { String::new() } else { format!("ot=th:{threshold}") };
        let mut rules = Rules { allowlist: self.allowlist, counts: [0; 5] };
        let mut resources: Vec<ResourceGroup> = Vec::new();
        let mut resource_positions: HashMap<usize, usize> = HashMap::new(); // resource object pointer -> index
        let mut count = 0usize;
        let (resource_key, scope_key) = (PyString::intern(py, "resource"), PyString::intern(py, "scope"));
        let serialize = PyString::intern(py, "SerializeToString");
        for buffered in spans.iter() {
            let payload: Vec<u8> = match buffered.downcast::<Row>() {
                Ok(row) => row.get().payload_bytes(py),
                Err(_) => buffered.getattr("payload")?.downcast_exact::<PyBytes>().map_err(|_| Decline)?.as_bytes().to_vec(),
            };
            let resource = buffered.getattr(&resource_key)?;
            let scope = buffered.getattr(&scope_key)?;
            let resource_at = match resource_positions.get(&(resource.as_ptr() as usize)) {
                Some(&index) => index,
                None => {
                    let bytes = resource.call_method0(&serialize)?.downcast_exact::<PyBytes>().map_err(|_| Decline)?
                        .as_bytes().to_vec();
                    let service_name = service_name(&bytes)?;
                    // Its attributes through the rules, as `strip_attributes` (a resource is no GenAI call).
                    let stripped = self.rewrite_child(py, &bytes, 0, bytes.len(), 1, None, 0, &mut rules)?;
                    resources.push(ResourceGroup {
                        resource: stripped, service_name, groups: Vec::new(), scopes: HashMap::new(), synthesized: None,
                    });
                    resource_positions.insert(resource.as_ptr() as usize, resources.len() - 1);
                    resources.len() - 1
                }
            };
            let group = &mut resources[resource_at];
            let group_at = match group.scopes.get(&(scope.as_ptr() as usize)) {
                Some(&index) => index,
                None => {
                    let bytes = scope.call_method0(&serialize)?.downcast_exact::<PyBytes>().map_err(|_| Decline)?
                        .as_bytes().to_vec();
                    let stripped = self.rewrite_child(py, &bytes, 0, bytes.len(), 3, None, 0, &mut rules)?;
                    group.groups.push(Group { scope: stripped, spans: Vec::new(), rows: Vec::new() });
                    group.scopes.insert(scope.as_ptr() as usize, group.groups.len() - 1);
                    group.groups.len() - 1
                }
            };
            // The record of this span, read by the span id as the payload has it.
            let payload_span_id = span_id_of(&payload)?;
            let record = by_span.get(&payload_span_id);
            let enrichment = match record {
                Some(record) => Some(enrichment(py, record, policy, &self.client_side, &self.default_source)?),
                None => None,
            };
            let written = self.write_span(py, &payload, &member, enrichment.as_ref(), &mut rules)?;
            count += 1;
            let service_name = &group.service_name;
            let (trace_hex, span_hex) = (hex(&written.trace_id), hex(&written.span_id));
            let row = PyTuple::new(py, [
                PyString::new(py, &trace_hex).into_any(), PyString::new(py, &span_hex).into_any(),
                PyString::new(py, &hex(&written.parent_span_id)).into_any(), PyString::new(py, &written.name).into_any(),
                written.kind.into_pyobject(py)?.into_any(), PyString::new(py, service_name).into_any(),
                written.start.min(INT64_MAX).into_pyobject(py)?.into_any(),
                written.end.min(INT64_MAX).into_pyobject(py)?.into_any(),
                written.status_code.into_pyobject(py)?.into_any(), PyString::new(py, &written.status_message).into_any(),
                PyString::new(py, &written.attributes_json).into_any(),
            ])?;
            let target = &mut group.groups[group_at];
            put_delimited(&mut target.spans, 0x12, &written.bytes);
            target.rows.push(row.into_any().unbind());
            let Some(enrichment) = enrichment else { continue };
            if enrichment.segments.is_empty() {
                continue;
            }
            let synthesized = match group.synthesized {
                Some(index) => index,
                None => {
                    let mut scope = Vec::new();
                    put_delimited(&mut scope, 0x0a, SCOPE_NAME.as_bytes());
                    group.groups.push(Group { scope, spans: Vec::new(), rows: Vec::new() });
                    group.synthesized = Some(group.groups.len() - 1);
                    group.groups.len() - 1
                }
            };
            let mut shared = Vec::with_capacity(64);
            put_delimited(&mut shared, 0x0a, &written.trace_id);
            if !member.is_empty() {
                put_delimited(&mut shared, 0x1a, member.as_bytes());
            }
            put_delimited(&mut shared, 0x22, &written.span_id);
            let mut body = Vec::with_capacity(shared.len() + 128);
            let mut json = String::with_capacity(48);
            for (name, seg_start, seg_end) in &enrichment.segments {
                let segment_id = segment_span_id(&written.trace_id, &written.span_id, name);
                // The fields `add_segment_span` and `with_trace_state` give, in `_segment_fields`' order.
                body.clear();
                body.extend_from_slice(&shared);
                body.extend_from_slice(&[0x12, 0x08]);
                body.extend_from_slice(&segment_id);
                put_delimited(&mut body, 0x2a, name.as_bytes());
                body.extend_from_slice(&[0x30, 0x01]);
                let value_size = delimited_size(name.len());
                body.push(0x4a);
                push_varint(&mut body, (delimited_size(SEGMENT_ATTRIBUTE.len()) + delimited_size(value_size)) as u64);
                put_delimited(&mut body, 0x0a, SEGMENT_ATTRIBUTE.as_bytes());
                body.push(0x12);
                push_varint(&mut body, value_size as u64);
                put_delimited(&mut body, 0x0a, name.as_bytes());
                body.push(0x39);
                body.extend_from_slice(&seg_start.to_le_bytes());
                body.push(0x41);
                body.extend_from_slice(&seg_end.to_le_bytes());
                let target = &mut group.groups[synthesized];
                put_delimited(&mut target.spans, 0x12, &body);
                json.clear();
                json.push('{');
                json_string(SEGMENT_ATTRIBUTE, &mut json);
                json.push_str(": ");
                json_string(name, &mut json);
                json.push('}');
                let row = PyTuple::new(py, [
                    PyString::new(py, &trace_hex).into_any(), PyString::new(py, &hex(&segment_id)).into_any(),
                    PyString::new(py, &span_hex).into_any(), PyString::new(py, name).into_any(),
                    1i32.into_pyobject(py)?.into_any(), PyString::new(py, service_name).into_any(),
                    (*seg_start).min(INT64_MAX).into_pyobject(py)?.into_any(),
                    (*seg_end).min(INT64_MAX).into_pyobject(py)?.into_any(),
                    0i32.into_pyobject(py)?.into_any(), PyString::new(py, "").into_any(),
                    PyString::new(py, &json).into_any(),
                ])?;
                target.rows.push(row.into_any().unbind());
                count += 1;
            }
        }
        // The request written once, its messages' lengths known beforehand.
        let scope_spans_size = |group: &Group| delimited_size(group.scope.len()) + group.spans.len();
        let resource_spans_size = |resource: &ResourceGroup| {
            delimited_size(resource.resource.len())
                + resource.groups.iter().map(|g| delimited_size(scope_spans_size(g))).sum::<usize>()
        };
        let total: usize = resources.iter().map(|r| delimited_size(resource_spans_size(r))).sum();
        let mut request = Vec::with_capacity(total);
        let rows = PyList::empty(py);
        for resource in &resources {
            request.push(0x0a);
            push_varint(&mut request, resource_spans_size(resource) as u64);
            put_delimited(&mut request, 0x0a, &resource.resource);
            for group in &resource.groups {
                request.push(0x12);
                push_varint(&mut request, scope_spans_size(group) as u64);
                put_delimited(&mut request, 0x0a, &group.scope);
                request.extend_from_slice(&group.spans);
                for row in &group.rows {
                    rows.append(row.bind(py))?;
                }
            }
        }
        debug_assert_eq!(request.len(), total);
        let counts = PyTuple::new(py, rules.counts)?;
        Ok(PyTuple::new(py, [
            PyBytes::new(py, &request).into_any(), count.into_pyobject(py)?.into_any(), rows.into_any(),
            counts.into_any(),
        ])?)
    }
}

/// The span id as the parsed span reads it (the field's last occurrence; a span sent with two is
/// declined later anyway).
fn span_id_of(payload: &[u8]) -> Step<Vec<u8>> {
    let mut reader = Reader::new(payload, 0, payload.len());
    let mut id = Vec::new();
    while !reader.done() {
        let (number, wire_type) = reader.tag()?;
        if number == 2 && wire_type == 2 {
            let (s, e) = reader.delimited()?;
            id = payload[s..e].to_vec();
        } else {
            reader.skip(number, wire_type, 0)?;
        }
    }
    Ok(id)
}

/// `json.dumps` of one float, for the tests (`repr`'s notation rules are the part to prove); None
/// where the writer declines.
#[pyfunction]
fn json_float_text(number: f64) -> Option<String> {
    let mut out = String::new();
    json_float(number, &mut out).ok()?;
    Some(out)
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<KeptTraceWriter>()?;
    module.add_function(wrap_pyfunction!(json_float_text, module)?)?;
    Ok(())
}
