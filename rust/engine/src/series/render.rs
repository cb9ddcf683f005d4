//! The families as prometheus_client 0.26 renders what `exposition.RecorderCollector.collect`
//! yields: text 0.0.4 (`exposition.generate_latest`, underscores escaping) and OpenMetrics
//! (`openmetrics.exposition.generate_latest` with `allow-utf-8` escaping, as `encode_metrics`
//! asks), exemplars in OpenMetrics only, without the final `# EOF` (the caller appends the
//! self-telemetry registry's families and ends the exposition).

use std::fmt::Write as _;

use super::family::{CounterFamily, HistogramFamily, KeyText};
use super::spec::{exposed_name, unit_word};
use super::Series;

/// `exposition.OVERFLOW_LABELS`: the overflow series' one label, as the SDKs' cardinality limit
/// labels theirs (`otel.metric.overflow=true`).
pub const OVERFLOW_LABEL: (&str, &str) = ("otel_metric_overflow", "true");

const OVERFLOW_HELP: &str = "Observations sent to a metric's overflow series because its series cap was reached.";
const TOO_LONG_HELP: &str = "Requests whose label value exceeded max_label_value_bytes, by label; their \
                             observations went to the overflow series.";
const BUDGET_HELP: &str = "Estimated exposition bytes of the span-derived metrics' series, against series_limit_mib.";

/// The accounting families (`accounting.Accounting`), rendered where `RecorderCollector.collect`
/// yields them: after the namings' families, before the segments family.
pub trait AccountingFamilies {
    /// `Accounting.collect`'s families (with `write_counter`, `write_header` and `write_sample`).
    fn render(&self, openmetrics: bool, out: &mut Vec<u8>);
    /// Each family's name and `overflowed`, in `Accounting.families` order (for
    /// `otel_llm_series_overflow`, after the recorder's own families).
    fn overflowed(&self, each: &mut dyn FnMut(&str, u64));
}

/// A float's text, formatted without allocating.
struct Digits {
    bytes: [u8; 40],
    len: usize,
}

impl Digits {
    fn new() -> Digits {
        Digits { bytes: [0; 40], len: 0 }
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }

    fn push(&mut self, byte: u8) {
        if self.len < self.bytes.len() {
            self.bytes[self.len] = byte;
            self.len += 1;
        }
    }

    fn push_str(&mut self, text: &str) {
        for &byte in text.as_bytes() {
            self.push(byte);
        }
    }
}

impl std::fmt::Write for Digits {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.push_str(text);
        Ok(())
    }
}

/// The significant digits (no trailing zeros) and decimal exponent of `{:e}`-style text.
fn split_scientific(text: &str) -> (Digits, i32) {
    let (mantissa, exponent) = text.split_once('e').unwrap_or((text, "0"));
    let mut digits = Digits::new();
    for byte in mantissa.bytes().filter(|b| *b != b'.') {
        digits.push(byte);
    }
    while digits.len > 1 && digits.bytes[digits.len - 1] == b'0' {
        digits.len -= 1;
    }
    (digits, exponent.parse().unwrap_or(0))
}

/// The digits Python's `repr` (David Gay's dtoa, mode 0) gives a positive finite float: the
/// fewest that read back as it (Rust's `{:e}` finds as many), and of those the ones nearest to
/// it, ties to even. Where the value lies exactly between two such, Rust's shortest formatting
/// may pick the other: the correctly rounded digits (`{:.N$e}`, ties to even) decide.
fn shortest_digits(value: f64) -> (Digits, i32) {
    let mut shortest = Digits::new();
    let _ = write!(shortest, "{value:e}");
    let (digits, exponent) = split_scientific(shortest.as_str());
    let mut nearest = Digits::new();
    let _ = write!(nearest, "{value:.*e}", digits.len - 1);
    let (rounded, rounded_exponent) = split_scientific(nearest.as_str());
    let differs = rounded.as_str() != digits.as_str() || rounded_exponent != exponent;
    if differs && nearest.as_str().parse::<f64>() == Ok(value) {
        return (rounded, rounded_exponent);
    }
    (digits, exponent)
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional for decimal exponents
/// -4 ..= 15, else `d.ddde±XX`.
fn py_repr(value: f64) -> Digits {
    let mut out = Digits::new();
    if value.is_nan() {
        out.push_str("nan");
        return out;
    }
    if value.is_infinite() {
        out.push_str(if value > 0.0 { "inf" } else { "-inf" });
        return out;
    }
    if value == 0.0 {
        out.push_str(if value.is_sign_negative() { "-0.0" } else { "0.0" });
        return out;
    }
    if value < 0.0 {
        out.push(b'-');
    }
    let (digits, exponent) = shortest_digits(value.abs());
    let digits = &digits.bytes[..digits.len];
    let count = digits.len() as i32;
    let point = exponent + 1; // the decimal point's position after the first digit's
    if !(-4 < point && point <= 16) {
        out.push(digits[0]);
        if count > 1 {
            out.push(b'.');
            digits[1..].iter().for_each(|&d| out.push(d));
        }
        let _ = write!(out, "e{}{:02}", if exponent < 0 { '-' } else { '+' }, exponent.abs());
    } else if point <= 0 {
        out.push_str("0.");
        (0..-point).for_each(|_| out.push(b'0'));
        digits.iter().for_each(|&d| out.push(d));
    } else if point >= count {
        digits.iter().for_each(|&d| out.push(d));
        (0..point - count).for_each(|_| out.push(b'0'));
        out.push_str(".0");
    } else {
        digits[..point as usize].iter().for_each(|&d| out.push(d));
        out.push(b'.');
        digits[point as usize..].iter().for_each(|&d| out.push(d));
    }
    out
}

/// `prometheus_client.utils.floatToGoString`: `+Inf`, `-Inf`, `NaN`, else Python's repr, with an
/// exponent from 1e6 on as Go writes one.
fn float_to_go_string(value: f64) -> Digits {
    if value == f64::INFINITY {
        let mut out = Digits::new();
        out.push_str("+Inf");
        return out;
    }
    if value == f64::NEG_INFINITY {
        let mut out = Digits::new();
        out.push_str("-Inf");
        return out;
    }
    if value.is_nan() {
        let mut out = Digits::new();
        out.push_str("NaN");
        return out;
    }
    let repr = py_repr(value);
    let text = repr.as_str();
    match text.find('.') {
        Some(dot) if value > 0.0 && dot > 6 => {
            let mut mantissa = Digits::new();
            mantissa.push(text.as_bytes()[0]);
            mantissa.push(b'.');
            mantissa.push_str(&text[1..dot]);
            mantissa.push_str(&text[dot + 1..]);
            let trimmed = mantissa.as_str().trim_end_matches(['0', '.']);
            let mut out = Digits::new();
            out.push_str(trimmed);
            let _ = write!(out, "e+{:02}", dot - 1);
            out
        }
        _ => repr,
    }
}

/// `exposition._le`: a bucket bound as its `le` label (`repr`, or `+Inf` for an infinity of either sign).
fn le_text(bound: f64) -> Digits {
    if bound.is_infinite() {
        let mut out = Digits::new();
        out.push_str("+Inf");
        return out;
    }
    py_repr(bound)
}

/// Label values and OpenMetrics help: `\`, newline and `"` escaped (`_escape(..., ALLOWUTF8)`).
fn write_escaped(out: &mut Vec<u8>, text: &str) {
    for &byte in text.as_bytes() {
        match byte {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'"' => out.extend_from_slice(b"\\\""),
            _ => out.push(byte),
        }
    }
}

/// Text 0.0.4 help: `\` and newline escaped, `"` kept.
fn write_text_help(out: &mut Vec<u8>, text: &str) {
    for &byte in text.as_bytes() {
        match byte {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            _ => out.push(byte),
        }
    }
}

fn is_legacy_label_rune(c: char, position: usize) -> bool {
    c.is_ascii_alphabetic() || c == '_' || (c.is_ascii_digit() && position > 0)
}

/// `validation._is_valid_legacy_labelname`: `^[a-zA-Z_][a-zA-Z0-9_]*$` (whose `$` also matches
/// before a final newline), not reserved (`__...`).
fn is_legacy_label_name(name: &str) -> bool {
    let core = name.strip_suffix('\n').unwrap_or(name);
    !core.is_empty() && core.chars().enumerate().all(|(i, c)| is_legacy_label_rune(c, i)) && !name.starts_with("__")
}

/// `openmetrics.escape_label_name`: text (underscores) replaces each invalid character by `_`;
/// OpenMetrics (allow-utf-8) quotes an invalid name.
fn write_label_name(out: &mut Vec<u8>, name: &str, openmetrics: bool) {
    if name.is_empty() {
        return;
    }
    let legacy = is_legacy_label_name(name);
    if openmetrics {
        if legacy {
            write_escaped(out, name);
        } else {
            out.push(b'"');
            write_escaped(out, name);
            out.push(b'"');
        }
    } else if legacy {
        out.extend_from_slice(name.as_bytes());
    } else {
        for (position, c) in name.chars().enumerate() {
            if is_legacy_label_rune(c, position) {
                out.push(c as u8);
            } else {
                out.push(b'_');
            }
        }
    }
}

fn write_pairs(out: &mut Vec<u8>, pairs: &[(&str, &str)], openmetrics: bool) {
    for (position, (name, value)) in pairs.iter().enumerate() {
        if position > 0 {
            out.push(b',');
        }
        write_label_name(out, name, openmetrics);
        out.extend_from_slice(b"=\"");
        write_escaped(out, value);
        out.push(b'"');
    }
}

/// `# HELP`, `# TYPE` (and OpenMetrics' `# UNIT`) of a family; text 0.0.4 names a counter's
/// family `<name>_total`.
pub fn write_header(out: &mut Vec<u8>, openmetrics: bool, name: &str, help: &str, kind: &str, unit: &str) {
    let total = if !openmetrics && kind == "counter" { "_total" } else { "" };
    let _ = write!(ByteWriter(out), "# HELP {name}{total} ");
    if openmetrics {
        write_escaped(out, help);
    } else {
        write_text_help(out, help);
    }
    let _ = write!(ByteWriter(out), "\n# TYPE {name}{total} {kind}\n");
    if openmetrics && !unit.is_empty() {
        let _ = writeln!(ByteWriter(out), "# UNIT {name} {unit}");
    }
}

/// One sample line: `name{labels} value`, labels sorted by name (`sorted(labels.items())`).
pub fn write_sample(out: &mut Vec<u8>, openmetrics: bool, name: &str, labels: &[(&str, &str)], value: f64) {
    let mut sorted = labels.to_vec();
    sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
    write_line(out, openmetrics, name, "", &sorted, value);
}

/// `<name><suffix>{labels} value` with the labels in the order given.
fn write_line(out: &mut Vec<u8>, openmetrics: bool, name: &str, suffix: &str, labels: &[(&str, &str)], value: f64) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(suffix.as_bytes());
    if !labels.is_empty() {
        out.push(b'{');
        write_pairs(out, labels, openmetrics);
        out.push(b'}');
    }
    out.push(b' ');
    out.extend_from_slice(float_to_go_string(value).as_str().as_bytes());
    out.push(b'\n');
}

struct ByteWriter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.0.extend_from_slice(text.as_bytes());
        Ok(())
    }
}

/// `exposition._labels` then `sorted(labels.items())`: `dict(zip(names, key))` (a repeated name
/// keeps its first place and its last value; the shorter of the two decides), or the overflow
/// label; sorted by name.
fn label_pairs<'a>(names: &'a [String], key: Option<&'a KeyText>) -> Vec<(&'a str, &'a str)> {
    let Some(key) = key else {
        return vec![OVERFLOW_LABEL];
    };
    let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(names.len());
    for (name, value) in names.iter().zip(key.values()) {
        match pairs.iter_mut().find(|(n, _)| *n == name.as_str()) {
            Some(pair) => pair.1 = value,
            None => pairs.push((name.as_str(), value)),
        }
    }
    pairs.sort_unstable_by(|a, b| a.0.cmp(b.0));
    pairs
}

/// `exposition._counter`, rendered: a counter family and its series in creation order (also the
/// accounting families' rendering).
pub fn write_counter(out: &mut Vec<u8>, openmetrics: bool, name: &str, help: &str, label_names: &[String],
                     family: &CounterFamily) {
    write_header(out, openmetrics, name, help, "counter", "");
    let sample = format!("{name}_total");
    for (key, value) in family.totals() {
        write_sample(out, openmetrics, &sample, &label_pairs(label_names, key), value);
    }
}

/// `exposition._histogram`, rendered.
fn write_histogram(out: &mut Vec<u8>, openmetrics: bool, metric_name: &str, help: &str, unit: &str,
                   label_names: &[String], family: &HistogramFamily) {
    write_header(out, openmetrics, metric_name, help, "histogram", unit);
    let bucket_name = format!("{metric_name}_bucket");
    let mut prefix: Vec<u8> = Vec::new();
    let mut suffix: Vec<u8> = Vec::new();
    for series in &family.family.series {
        let pairs = label_pairs(label_names, series.key.as_ref());
        // `{**labels, "le": le}`: le replaces a label of that name, else takes its sorted place.
        let (before, after) = match pairs.binary_search_by(|pair| pair.0.cmp("le")) {
            Ok(at) => (&pairs[..at], &pairs[at + 1..]),
            Err(at) => (&pairs[..at], &pairs[at..]),
        };
        prefix.clear();
        write_pairs(&mut prefix, before, openmetrics);
        if !before.is_empty() {
            prefix.push(b',');
        }
        suffix.clear();
        if !after.is_empty() {
            suffix.push(b',');
            write_pairs(&mut suffix, after, openmetrics);
        }
        let bounds = family.bounds_of(series);
        let mut cumulative = 0.0;
        for (index, count) in series.counts.iter().enumerate() {
            cumulative += count;
            out.extend_from_slice(bucket_name.as_bytes());
            out.push(b'{');
            out.extend_from_slice(&prefix);
            write_label_name(out, "le", openmetrics);
            out.extend_from_slice(b"=\"");
            let le = match bounds.get(index) {
                Some(&bound) => le_text(bound),
                None => le_text(f64::INFINITY),
            };
            write_escaped(out, le.as_str());
            out.push(b'"');
            out.extend_from_slice(&suffix);
            out.extend_from_slice(b"} ");
            out.extend_from_slice(float_to_go_string(cumulative).as_str().as_bytes());
            if openmetrics {
                if let Some(Some(exemplar)) = series.exemplars.get(index) {
                    out.extend_from_slice(b" # {span_id=\"");
                    write_hex(out, &exemplar.span_id);
                    out.extend_from_slice(b"\",trace_id=\"");
                    write_hex(out, &exemplar.trace_id);
                    out.extend_from_slice(b"\"} ");
                    out.extend_from_slice(float_to_go_string(exemplar.value).as_str().as_bytes());
                    out.push(b' ');
                    out.extend_from_slice(py_repr(exemplar.timestamp).as_str().as_bytes());
                }
            }
            out.push(b'\n');
        }
        write_line(out, openmetrics, metric_name, "_count", &pairs, series.count);
        write_line(out, openmetrics, metric_name, "_sum", &pairs, series.total);
    }
}

fn write_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &byte in bytes {
        out.push(HEX[usize::from(byte >> 4)]);
        out.push(HEX[usize::from(byte & 15)]);
    }
}

impl Series {
    /// `RecorderCollector.collect`'s families rendered (text 0.0.4, or OpenMetrics with
    /// exemplars), without the accounting families.
    pub fn render(&self, openmetrics: bool, out: &mut Vec<u8>) {
        self.render_with(openmetrics, out, None);
    }

    /// `render`, with the accounting families where `collect` yields them (and their overflow counts).
    pub fn render_with(&self, openmetrics: bool, out: &mut Vec<u8>, accounting: Option<&dyn AccountingFamilies>) {
        for naming in &self.namings {
            for hist in &naming.histograms {
                write_histogram(out, openmetrics, &hist.metric_name, &hist.description, unit_word(&hist.unit),
                                &hist.exposed_label_names, &self.hists[hist.family]);
            }
            for counter in &naming.counters {
                write_counter(out, openmetrics, &counter.metric_name, &counter.description,
                              &counter.exposed_label_names, &self.counters[counter.family]);
            }
        }
        if let Some(accounting) = accounting {
            accounting.render(openmetrics, out);
        }
        let segments = &self.segments;
        write_histogram(out, openmetrics, &segments.metric_name, &segments.description, unit_word(&segments.unit),
                        &segments.exposed_label_names, &self.hists[segments.family]);

        write_header(out, openmetrics, "otel_llm_series_overflow", OVERFLOW_HELP, "counter", "");
        for (name, overflowed) in self.overflow_counts() {
            write_sample(out, openmetrics, "otel_llm_series_overflow_total", &[("metric", name)], overflowed as f64);
        }
        if let Some(accounting) = accounting {
            accounting.overflowed(&mut |name, overflowed| {
                // Accounting families' names have no dots: exposed as they are.
                let name = exposed_name(name, "s");
                write_sample(out, openmetrics, "otel_llm_series_overflow_total", &[("metric", &name)], overflowed as f64);
            });
        }
        write_header(out, openmetrics, "otel_llm_label_values_too_long", TOO_LONG_HELP, "counter", "");
        for (label, requests) in self.too_long() {
            write_sample(out, openmetrics, "otel_llm_label_values_too_long_total", &[("label", label)], requests as f64);
        }
        write_header(out, openmetrics, "otel_llm_series_bytes", BUDGET_HELP, "gauge", "");
        write_sample(out, openmetrics, "otel_llm_series_bytes", &[("state", "used")], self.budget.used as f64);
        write_sample(out, openmetrics, "otel_llm_series_bytes", &[("state", "limit")], self.budget.limit as f64);
    }

    /// Each family's `otel_llm_series_overflow` label and `overflowed`, in `families()` order
    /// (the segments family, then each naming's histograms and counters).
    pub fn overflow_counts(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        let families = std::iter::once(self.hists[self.segments.family].family.overflowed).chain(self.namings.iter().flat_map(|naming| {
            naming
                .histograms
                .iter()
                .map(|h| self.hists[h.family].family.overflowed)
                .chain(naming.counters.iter().map(|c| self.counters[c.family].overflowed()))
        }));
        self.overflow_names.iter().map(String::as_str).zip(families)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(value: f64) -> String {
        py_repr(value).as_str().to_string()
    }

    fn go(value: f64) -> String {
        float_to_go_string(value).as_str().to_string()
    }

    #[test]
    fn floats_print_as_python_repr() {
        // Python 3: repr() of each.
        for (value, expected) in [
            (0.1, "0.1"),
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (123456789.0, "123456789.0"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
            (-2.5, "-2.5"),
            (1700000000.123456, "1700000000.123456"),
            (0.30000000000000004, "0.30000000000000004"),
        ] {
            assert_eq!(repr(value), expected, "{value:e}");
        }
    }

    #[test]
    fn floats_print_as_prometheus_client_go_strings() {
        for (value, expected) in [
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
            (3.0, "3.0"),
            (123456.0, "123456.0"),
            (1234567.0, "1.234567e+06"),
            (1000000.0, "1e+06"),
            (16777216.0, "1.6777216e+07"),
            (12345678.5, "1.23456785e+07"),
            (-1234567.0, "-1234567.0"),
            (1e22, "1e+22"),
            (0.5, "0.5"),
        ] {
            assert_eq!(go(value), expected, "{value:e}");
        }
    }

    /// `tests/data/series/floats.json` (written by `generate.py`): Python's `repr` and
    /// prometheus_client's `floatToGoString` of thousands of floats (random bit patterns, rounded
    /// decimals, integers).
    #[test]
    fn floats_print_as_python_prints_them() {
        let corpus = crate::series::tests::floats_corpus();
        let rows = corpus["floats"].as_array().unwrap();
        assert!(rows.len() > 5000);
        for row in rows {
            let value = f64::from_bits(row[0].as_u64().unwrap());
            assert_eq!(repr(value), row[1].as_str().unwrap(), "repr of {value:e}");
            assert_eq!(go(value), row[2].as_str().unwrap(), "floatToGoString of {value:e}");
        }
    }

    #[test]
    fn label_names_escape_per_format() {
        let name = |name: &str, openmetrics: bool| {
            let mut out = Vec::new();
            write_label_name(&mut out, name, openmetrics);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(name("model_name", false), "model_name");
        assert_eq!(name("model_name", true), "model_name");
        assert_eq!(name("1x", false), "_x");
        assert_eq!(name("1x", true), "\"1x\"");
        assert_eq!(name("__x", false), "__x");
        assert_eq!(name("__x", true), "\"__x\"");
        assert_eq!(name("a.b", false), "a_b");
        assert_eq!(name("a\"b", true), "\"a\\\"b\"");
    }

    #[test]
    fn labels_keep_the_last_value_of_a_repeated_name_and_sort() {
        let names: Vec<String> = ["b", "a", "b"].iter().map(|s| s.to_string()).collect();
        let key = KeyText::new(["1", "2", "3", "4"].into_iter());
        assert_eq!(label_pairs(&names, Some(&key)), vec![("a", "2"), ("b", "3")]);
        assert_eq!(label_pairs(&names, None), vec![OVERFLOW_LABEL]);
        let short = KeyText::new(["1"].into_iter());
        assert_eq!(label_pairs(&names, Some(&short)), vec![("b", "1")]);
    }

    #[test]
    fn headers_differ_per_format() {
        let mut text = Vec::new();
        write_header(&mut text, false, "c", "a \"q\"\nb\\", "counter", "");
        assert_eq!(String::from_utf8(text).unwrap(), "# HELP c_total a \"q\"\\nb\\\\\n# TYPE c_total counter\n");
        let mut om = Vec::new();
        write_header(&mut om, true, "h_seconds", "d\"", "histogram", "seconds");
        assert_eq!(String::from_utf8(om).unwrap(),
                   "# HELP h_seconds d\\\"\n# TYPE h_seconds histogram\n# UNIT h_seconds seconds\n");
    }
}
