//! Reading a span's attributes and its resource's strings as `requests.py` reads them from a
//! `BufferedSpan`'s kept attributes (`_text`, `_number`, `_route`), and the upstream sampling
//! weight (`adjusted_count`).
//!
//! Python holds a kept attribute as `attributes.buffered_value` converts it (a string as is, an int,
//! a float, a bool, a list, a dict, bytes as hex) and renders it as text with `str()`: for a double
//! (and a list inside a list) that is `repr`, whose digits this crate does not reproduce, so a
//! rule that needs such a text declines the trace. Where only "is it one of these routes" is asked,
//! the answer does not depend on the digits (no `repr` of a float or a list starts with "/").

use std::borrow::Cow;

use crate::model::{array_first, entry_value, AnyValue};
use crate::record::Text;
use crate::wire::{entry_key, Reader};

use super::{Decline, Fail};

/// An attribute read as `requests._text` reads it.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum AttrText<'t> {
    /// No such attribute, or one `_text` reads as `None` (a map, an empty list, no value).
    Absent,
    Text(Text<'t>),
    /// `str()` of a double or of a list: `repr` rules this crate does not port. Never empty.
    Repr,
}

/// `requests._text`: the value of a kept attribute as text.
pub(super) fn attr_text(value: Option<AnyValue<'_>>) -> AttrText<'_> {
    let Some(value) = value else { return AttrText::Absent };
    // `isinstance(value, list)`: its first element, converted as `any_value_to_python` does.
    let value = match value {
        AnyValue::Array(array) => match array_first(array) {
            Some(AnyValue::Array(_)) => return AttrText::Repr, // `str()` of a list
            Some(first) => first,
            None => return AttrText::Absent,
        },
        other => other,
    };
    match value {
        AnyValue::Empty | AnyValue::KvList(_) | AnyValue::Array(_) => AttrText::Absent,
        AnyValue::Str(text) => AttrText::Text(Cow::Borrowed(text)),
        AnyValue::Bool(flag) => AttrText::Text(Cow::Borrowed(if flag { "true" } else { "false" })),
        AnyValue::Int(number) => AttrText::Text(Cow::Owned(number.to_string())),
        AnyValue::Bytes(bytes) => AttrText::Text(Cow::Owned(hex(bytes))),
        AnyValue::Double(_) => AttrText::Repr,
    }
}

/// `bytes.hex()`: lowercase, two digits a byte.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for byte in bytes {
        out.push(DIGITS[(byte >> 4) as usize] as char);
        out.push(DIGITS[(byte & 15) as usize] as char);
    }
    out
}

impl<'t> AttrText<'t> {
    /// The text, `None` where `_text` gives `None`; declined where it is a `repr`.
    pub(super) fn text(self) -> Result<Option<Text<'t>>, Decline> {
        match self {
            AttrText::Absent => Ok(None),
            AttrText::Text(text) => Ok(Some(text)),
            AttrText::Repr => Err(Decline::ReprText),
        }
    }

    /// Python's truthiness of `_text`'s result: a text that is not empty.
    fn truthy(&self) -> bool {
        match self {
            AttrText::Absent => false,
            AttrText::Text(text) => !text.is_empty(),
            AttrText::Repr => true,
        }
    }
}

/// `requests._ROUTE_OPERATIONS`.
const ROUTE_OPERATIONS: [(&str, &str); 8] = [
    ("/v1/chat/completions", "chat"),
    ("/chat/completions", "chat"),
    ("/v1/completions", "text_completion"),
    ("/completions", "text_completion"),
    ("/v1/embeddings", "embeddings"),
    ("/embeddings", "embeddings"),
    ("/generate", "text_completion"),
    ("/generate_stream", "text_completion"),
];

/// `_ROUTE_OPERATIONS.get(_route(span))` where `_route` is `_text(span, "http.route") or
/// _text(span, "url.path")`: the operation the span's route names, if it names one. A `repr` is
/// truthy and is no route, so it needs no digits.
pub(super) fn route_operation<'a>(http_route: AttrText<'a>, url_path: impl FnOnce() -> AttrText<'a>) -> Option<&'static str> {
    let route = if http_route.truthy() { http_route } else { url_path() };
    let AttrText::Text(route) = route else { return None };
    ROUTE_OPERATIONS.iter().find(|(path, _)| *path == route).map(|(_, operation)| *operation)
}

/// What `requests._number` makes of an attribute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Number {
    /// `None` (absent, no value, a bool).
    Absent,
    Value(f64),
    /// `float()` raises `TypeError` or `ValueError` (a list, a map, a text that is no number).
    Invalid,
}

/// `requests._number`: `None` for nothing or a bool, else `float(value)`. A string `float()`
/// parses by rules of its own (whitespace, underscores, "inf", Unicode digits) is declined; one of
/// the plain decimal grammar, which Rust and Python both round correctly, is parsed.
pub(super) fn number(value: Option<AnyValue<'_>>) -> Result<Number, Decline> {
    Ok(match value {
        None | Some(AnyValue::Empty) | Some(AnyValue::Bool(_)) => Number::Absent,
        Some(AnyValue::Int(value)) => Number::Value(value as f64),
        Some(AnyValue::Double(value)) => Number::Value(value),
        Some(AnyValue::Array(_)) | Some(AnyValue::KvList(_)) => Number::Invalid,
        // The hex of bytes holds no sign, point, space or letter `float()` reads but `e`: it is a
        // number exactly when it is digits with an optional exponent, which the grammar decides.
        Some(AnyValue::Bytes(bytes)) => match plain_decimal(&hex(bytes)) {
            Some(value) => Number::Value(value),
            None => Number::Invalid,
        },
        Some(AnyValue::Str("")) => Number::Invalid,
        Some(AnyValue::Str(text)) => match plain_decimal(text) {
            Some(value) => Number::Value(value),
            None => return Err(Decline::NumberText),
        },
    })
}

/// `[+-]?(digits[.digits?]|.digits)([eE][+-]?digits)?` parsed (correctly rounded), else `None`.
fn plain_decimal(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let mut at = 0;
    let digits = |at: &mut usize| {
        let from = *at;
        while *at < bytes.len() && bytes[*at].is_ascii_digit() {
            *at += 1;
        }
        *at - from
    };
    if at < bytes.len() && (bytes[at] == b'+' || bytes[at] == b'-') {
        at += 1;
    }
    let mut mantissa = digits(&mut at);
    if at < bytes.len() && bytes[at] == b'.' {
        at += 1;
        mantissa += digits(&mut at);
    }
    if mantissa == 0 {
        return None;
    }
    if at < bytes.len() && (bytes[at] == b'e' || bytes[at] == b'E') {
        at += 1;
        if at < bytes.len() && (bytes[at] == b'+' || bytes[at] == b'-') {
            at += 1;
        }
        if digits(&mut at) == 0 {
            return None;
        }
    }
    if at != bytes.len() {
        return None;
    }
    text.parse().ok()
}

/// The `KeyValue`s in field `field` of a message (a resource's attributes are its field 1, a
/// span's its field 9) as (key, the entry's bytes: `entry_value` reads its value), in order; they
/// end at bytes that are not a message (the receivers validated them).
pub(super) fn entries(message: &[u8], field: u32) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut reader = Reader::new(message, 0, message.len());
    std::iter::from_fn(move || {
        while !reader.done() {
            let (number, wire_type) = reader.tag().ok()?;
            if number != field || wire_type != 2 {
                reader.skip(number, wire_type, 0).ok()?;
                continue;
            }
            let (s, e) = reader.delimited().ok()?;
            return Some((entry_key(message, s, e).ok()?, &message[s..e]));
        }
        None
    })
}

/// `digest._strings_of(resource)[0].get(key)`: the resource's string attribute `key` (of several
/// entries with that key, the last that holds a string, as the dict comprehension keeps it).
pub(super) fn resource_string<'t>(resource: &'t [u8], key: &str) -> Option<&'t str> {
    entries(resource, 1).filter(|(k, _)| *k == key.as_bytes())
        .filter_map(|(_, entry)| if let AnyValue::Str(text) = entry_value(entry) { Some(text) } else { None })
        .last()
}

/// The first `KeyValue` named `key` among a span's attributes, as a loop over `Span.attributes`
/// meets it (`_pair_sglang_pd`'s `next(...)`).
pub(super) fn first_attribute<'a>(span: &'a [u8], key: &str) -> Option<AnyValue<'a>> {
    entries(span, 9).find(|(k, _)| *k == key.as_bytes()).map(|(_, entry)| entry_value(entry))
}

// --- upstream sampling ---------------------------------------------------------------------

/// `requests.MAX_ADJUSTED_COUNT`.
pub(super) const MAX_ADJUSTED_COUNT: f64 = 1_048_576.0; // 2**20

/// `str.strip()`'s whitespace among ASCII characters (`str.isspace`: the separators \x1c-\x1f too).
fn python_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1f)
}

/// `str.partition(separator)`'s head and tail.
fn partition(text: &str, separator: char) -> (&str, &str) {
    text.split_once(separator).unwrap_or((text, ""))
}

/// `requests.adjusted_count`: 1 / the sampling probability an OTel `ot=th:` threshold says, 1.0
/// without one; `MalformedSpan`'s reasons for a threshold that is not 1-14 hex digits or whose
/// count is beyond `MAX_ADJUSTED_COUNT`. A trace state that is not ASCII (whose `strip()` would
/// take Unicode spaces) is declined.
pub(super) fn adjusted_count(trace_state: &str) -> Result<f64, Fail> {
    if !trace_state.contains("th:") {
        return Ok(1.0);
    }
    if !trace_state.is_ascii() {
        return Err(Fail::Decline(Decline::TraceState));
    }
    for member in trace_state.split(',') {
        let member = member.trim_matches(|c: char| python_space(c as u8));
        let (key, value) = partition(member, '=');
        if key != "ot" {
            continue;
        }
        for field in value.split(';') {
            let (name, threshold) = partition(field, ':');
            if name != "th" {
                continue;
            }
            if !(1..=14).contains(&threshold.len()) || !threshold.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Fail::Malformed("invalid_sampling_threshold"));
            }
            let rejected = u64::from_str_radix(&format!("{threshold:0<14}"), 16)
                .map_err(|_| Fail::Malformed("invalid_sampling_threshold"))?;
            let count = two_to_56_over((1u64 << 56) - rejected);
            if count > MAX_ADJUSTED_COUNT {
                return Err(Fail::Malformed("absurd_sampling_threshold"));
            }
            return Ok(count);
        }
    }
    Ok(1.0)
}

/// `2**56 / denominator` as Python divides two ints: the exact quotient rounded once (ties to
/// even). The quotient scaled by 2**64 holds at least 65 bits, so a remainder ORed into its last
/// bit decides a tie exactly as the exact quotient would, and the cast rounds to nearest-even.
fn two_to_56_over(denominator: u64) -> f64 {
    let denominator = u128::from(denominator.max(1));
    let numerator = 1u128 << 120;
    let quotient = (numerator / denominator) | u128::from(!numerator.is_multiple_of(denominator));
    quotient as f64 * 2f64.powi(-64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(bytes: &[u8]) -> Option<AnyValue<'_>> {
        Some(crate::model::any_value(bytes))
    }

    #[test]
    fn texts_are_str_of_the_buffered_value() {
        assert_eq!(attr_text(None), AttrText::Absent);
        assert_eq!(attr_text(Some(AnyValue::Empty)), AttrText::Absent);
        assert_eq!(attr_text(Some(AnyValue::Str("x"))).text().unwrap().as_deref(), Some("x"));
        assert_eq!(attr_text(Some(AnyValue::Int(-42))).text().unwrap().as_deref(), Some("-42"));
        assert_eq!(attr_text(Some(AnyValue::Bool(true))).text().unwrap().as_deref(), Some("true"));
        assert_eq!(attr_text(Some(AnyValue::Bytes(&[0xab, 0x01]))).text().unwrap().as_deref(), Some("ab01"));
        assert_eq!(attr_text(Some(AnyValue::Double(0.5))), AttrText::Repr);
        assert_eq!(attr_text(Some(AnyValue::Double(0.5))).text(), Err(Decline::ReprText));
        assert_eq!(attr_text(Some(AnyValue::KvList(b""))), AttrText::Absent);
        // Arrays: the first element converted; none; a list in a list is `repr`'s.
        assert_eq!(attr_text(Some(AnyValue::Array(b""))), AttrText::Absent);
        let array = [0x0a, 3, 0x0a, 1, b'a', 0x0a, 3, 0x0a, 1, b'b']; // ["a", "b"]
        assert_eq!(attr_text(Some(AnyValue::Array(&array))).text().unwrap().as_deref(), Some("a"));
        let nested = [0x0a, 2, 0x2a, 0]; // [[]]
        assert_eq!(attr_text(Some(AnyValue::Array(&nested))), AttrText::Repr);
        let map_first = [0x0a, 2, 0x32, 0]; // [{}]
        assert_eq!(attr_text(Some(AnyValue::Array(&map_first))), AttrText::Absent);
        let double_first = [0x0a, 9, 0x21, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f]; // [1.0]
        assert_eq!(attr_text(Some(AnyValue::Array(&double_first))), AttrText::Repr);
        assert_eq!(any(&[0x10, 1]), Some(AnyValue::Bool(true)));
    }

    #[test]
    fn routes_need_no_repr() {
        let text = |s: &'static str| AttrText::Text(Cow::Borrowed(s));
        assert_eq!(route_operation(text("/v1/chat/completions"), || unreachable!()), Some("chat"));
        assert_eq!(route_operation(text("/health"), || text("/generate")), None); // truthy: url.path unread
        assert_eq!(route_operation(text(""), || text("/generate")), Some("text_completion"));
        assert_eq!(route_operation(AttrText::Absent, || text("/v1/embeddings")), Some("embeddings"));
        assert_eq!(route_operation(AttrText::Repr, || text("/generate")), None);
        assert_eq!(route_operation(AttrText::Absent, || AttrText::Repr), None);
        assert_eq!(route_operation(AttrText::Absent, || AttrText::Absent), None);
    }

    #[test]
    fn numbers_are_float_of_the_buffered_value() {
        assert_eq!(number(None), Ok(Number::Absent));
        assert_eq!(number(Some(AnyValue::Bool(true))), Ok(Number::Absent));
        assert_eq!(number(Some(AnyValue::Empty)), Ok(Number::Absent));
        assert_eq!(number(Some(AnyValue::Int(i64::MAX))), Ok(Number::Value(9.223372036854776e18)));
        assert_eq!(number(Some(AnyValue::Double(-0.5))), Ok(Number::Value(-0.5)));
        assert_eq!(number(Some(AnyValue::Array(b""))), Ok(Number::Invalid));
        assert_eq!(number(Some(AnyValue::KvList(b""))), Ok(Number::Invalid));
        for (text, value) in [("0.25", 0.25), ("+1.", 1.0), ("-.5", -0.5), ("1e3", 1000.0), ("1.5E-3", 0.0015),
                              ("1e400", f64::INFINITY), ("0.1000000000000000055511151231257827", 0.1)] {
            assert_eq!(number(Some(AnyValue::Str(text))), Ok(Number::Value(value)), "{text}");
        }
        assert_eq!(number(Some(AnyValue::Str(""))), Ok(Number::Invalid));
        for text in [" 1", "1_0", "inf", "nan", ".", "e5", "1e", "1e+", "--1", "0x10", "١"] {
            assert_eq!(number(Some(AnyValue::Str(text))), Err(Decline::NumberText), "{text}");
        }
        assert_eq!(number(Some(AnyValue::Bytes(&[0x12, 0x34]))), Ok(Number::Value(1234.0)));
        assert_eq!(number(Some(AnyValue::Bytes(&[0x1e, 0x03]))), Ok(Number::Value(1000.0))); // "1e03"
        assert_eq!(number(Some(AnyValue::Bytes(&[0xab]))), Ok(Number::Invalid));
        assert_eq!(number(Some(AnyValue::Bytes(&[]))), Ok(Number::Invalid));
    }

    fn entry(key: &str, value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x0a, key.len() as u8];
        out.extend_from_slice(key.as_bytes());
        out.push(0x12);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
        out
    }

    fn message(field: u8, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in entries {
            out.push(field << 3 | 2);
            out.push(e.len() as u8);
            out.extend_from_slice(e);
        }
        out
    }

    #[test]
    fn resource_strings_keep_the_last_string_value() {
        let resource = message(1, &[entry("service.name", b"\x0a\x01a"), entry("service.name", b"\x0a\x01b"),
                                    entry("service.name", b"\x18\x05"), entry("model", b"\x18\x05"),
                                    entry("empty", b"\x0a\x00")]);
        assert_eq!(resource_string(&resource, "service.name"), Some("b"));
        assert_eq!(resource_string(&resource, "model"), None);
        assert_eq!(resource_string(&resource, "empty"), Some(""));
        assert_eq!(resource_string(&resource, "absent"), None);
        let span = message(9, &[entry("room", b"\x18\x07"), entry("room", b"\x0a\x01x")]);
        assert_eq!(first_attribute(&span, "room"), Some(AnyValue::Int(7)));
        assert_eq!(first_attribute(&span, "other"), None);
    }

    #[test]
    fn adjusted_counts_are_pythons() {
        assert_eq!(adjusted_count(""), Ok(1.0));
        assert_eq!(adjusted_count("vendor=a"), Ok(1.0));
        assert_eq!(adjusted_count("ot=th:8"), Ok(2.0));
        assert_eq!(adjusted_count("ot=th:0"), Ok(1.0));
        assert_eq!(adjusted_count("ot=th:c"), Ok(4.0));
        assert_eq!(adjusted_count("ot=th:4"), Ok(4.0 / 3.0));
        assert_eq!(adjusted_count("ot=th:fffff"), Ok(1_048_576.0)); // 2**20: the largest taken
        assert_eq!(adjusted_count("ot=th:ffffff"), Err(Fail::Malformed("absurd_sampling_threshold")));
        assert_eq!(adjusted_count("ot=th:zz"), Err(Fail::Malformed("invalid_sampling_threshold")));
        assert_eq!(adjusted_count("ot=th:"), Err(Fail::Malformed("invalid_sampling_threshold")));
        assert_eq!(adjusted_count("ot=th:123456789abcdef"), Err(Fail::Malformed("invalid_sampling_threshold")));
        assert_eq!(adjusted_count("ot=p:3"), Ok(1.0));
        assert_eq!(adjusted_count("x=y,ot=th:C"), Ok(4.0));
        assert_eq!(adjusted_count(" \x1cot=rv:abc;th:8\t"), Ok(2.0)); // Python strips \x1c too
        assert_eq!(adjusted_count("ot=th:8\u{2003}"), Err(Fail::Decline(Decline::TraceState)));
        // 2**56 / (2**56 - t), rounded once: dividing two rounded doubles gives the next double.
        let threshold = 0x78e5107311d8a4u64;
        let exact = adjusted_count("ot=th:78e5107311d8a4").unwrap();
        let twice_rounded = (1u64 << 56) as f64 / ((1u64 << 56) - threshold) as f64;
        assert_ne!(exact, twice_rounded);
        assert!(nearest(exact, (1u64 << 56) - threshold));
        for threshold in [1u64, 0x0080_0000_0000_0001, 0x00ff_fff0_0000_0000, 0x0012_3456_789a_bcde, 0x000f_ffff_ffff_ffff] {
            assert!(nearest(two_to_56_over((1u64 << 56) - threshold), (1u64 << 56) - threshold), "{threshold:x}");
        }
    }

    /// Whether `value` is the double nearest 2**56 / `denominator` (ties: the even one), checked in
    /// exact integer arithmetic against its two neighbours.
    fn nearest(value: f64, denominator: u64) -> bool {
        // value = m * 2**e with m < 2**53; the error of m' * 2**e against 2**56 / d, scaled by d * 2**-e.
        let bits = value.to_bits();
        let exponent = ((bits >> 52) & 0x7ff) as i32 - 1075;
        let mantissa = (bits & ((1 << 52) - 1)) | (1 << 52);
        assert!(exponent < 0 && exponent > -120);
        let target = 1i128 << (56 - exponent); // 2**56 * 2**-e
        let error = |m: u64| (m as i128 * denominator as i128 - target).abs();
        let own = error(mantissa);
        own < error(mantissa - 1) && (own < error(mantissa + 1) || (own == error(mantissa + 1) && mantissa.is_multiple_of(2)))
    }
}
