//! prometheus_client's text encoders (0.26) for the families Python's collectors yield, as plain
//! data: a `MetricFamily` is a `prometheus_client.metrics_core.Metric` (name, documentation, type,
//! unit, samples), and `encode` writes what `exposition.generate_latest` (text 0.0.4) or
//! `openmetrics.exposition.generate_latest(escaping=ALLOWUTF8)` writes for it (without the
//! OpenMetrics `# EOF` line, which ends the whole exposition). Counters and gauges without
//! exemplars or timestamps: what the accounting families yield.
//!
//! Names are legacy-valid Prometheus names (checked where families are made), for which the
//! encoders' name escaping is the identity.

use std::fmt::Write;

/// A sample: `prometheus_client.samples.Sample` without timestamp and exemplar. Labels in the
/// order the collector built them (the encoders sort them by name).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// `prometheus_client.metrics_core.Metric`: `kind` is its type (`counter`, `gauge`).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricFamily {
    pub name: String,
    pub documentation: String,
    pub kind: &'static str,
    pub unit: String,
    pub samples: Vec<Sample>,
}

/// Python's `repr(float)`: the shortest digits that read back as the same float (Rust's `{:e}`
/// gives the same shortest, closest digits), fixed notation for 1e-4 <= |x| < 1e16, else
/// scientific with a signed exponent of at least two digits.
pub fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let sign = if value.is_sign_negative() { "-" } else { "" };
    if value == 0.0 {
        return format!("{sign}0.0");
    }
    let shortest = format!("{:e}", value.abs());
    let (mantissa, exponent) = shortest.split_once('e').unwrap_or((&shortest, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exponent) {
        if exponent >= 0 {
            let point = exponent as usize + 1;
            if digits.len() <= point {
                format!("{sign}{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{sign}{}.{}", &digits[..point], &digits[point..])
            }
        } else {
            format!("{sign}0.{}{digits}", "0".repeat((-exponent - 1) as usize))
        }
    } else {
        let fraction = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{}{fraction}e{exponent_sign}{:02}", &digits[..1], exponent.abs())
    }
}

/// `prometheus_client.utils.floatToGoString`: `+Inf`, `-Inf`, `NaN`, else `repr`, with Go's
/// exponent form for positive values of seven or more integer digits.
pub fn float_to_go_string(value: f64) -> String {
    if value == f64::INFINITY {
        return "+Inf".into();
    }
    if value == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    if value.is_nan() {
        return "NaN".into();
    }
    let text = python_float_repr(value);
    let dot = text.find('.');
    match dot {
        Some(dot) if value > 0.0 && dot > 6 => {
            let joined = format!("{}.{}{}", &text[..1], &text[1..dot], &text[dot + 1..]);
            let mantissa = joined.trim_end_matches(['0', '.']);
            format!("{mantissa}e+{:02}", dot - 1)
        }
        _ => text,
    }
}

/// Backslash, newline and (where asked) double quote escaped, as the encoders escape label values
/// (always the three) and documentation (text 0.0.4: the first two).
fn escaped(text: &str, quotes: bool, out: &mut String) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            _ => out.push(c),
        }
    }
}

fn sample_line(sample: &Sample, out: &mut String) {
    out.push_str(&sample.name);
    if !sample.labels.is_empty() {
        let mut labels: Vec<&(String, String)> = sample.labels.iter().collect();
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        out.push('{');
        for (index, (name, value)) in labels.into_iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            out.push_str(name);
            out.push_str("=\"");
            escaped(value, true, out);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&float_to_go_string(sample.value));
    out.push('\n');
}

/// Appends `family` as `generate_latest` writes it: text 0.0.4 (a counter's HELP and TYPE name
/// with `_total`, an `unknown` type as `untyped`), or OpenMetrics (its own name, a UNIT line
/// where it has a unit).
pub fn encode(family: &MetricFamily, openmetrics: bool, out: &mut String) {
    let name = if openmetrics || family.kind != "counter" {
        family.name.clone()
    } else {
        format!("{}_total", family.name)
    };
    let kind = if !openmetrics && family.kind == "unknown" { "untyped" } else { family.kind };
    out.push_str("# HELP ");
    out.push_str(&name);
    out.push(' ');
    escaped(&family.documentation, openmetrics, out);
    out.push('\n');
    let _ = writeln!(out, "# TYPE {name} {kind}");
    if openmetrics && !family.unit.is_empty() {
        let _ = writeln!(out, "# UNIT {name} {}", family.unit);
    }
    for sample in &family.samples {
        sample_line(sample, out);
    }
}

/// A legacy-valid Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`), or label name (without `:`).
pub fn legacy_name(name: &str, metric: bool) -> bool {
    !name.is_empty()
        && name.chars().enumerate().all(|(index, c)| {
            c.is_ascii_alphabetic() || c == '_' || (metric && c == ':') || (index > 0 && c.is_ascii_digit())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_python_writes_them() {
        // (value, repr(value)) from CPython 3.11
        for (value, repr) in [(0.0, "0.0"), (-0.0, "-0.0"), (1.0, "1.0"), (0.1, "0.1"), (1e-4, "0.0001"),
                              (1e-5, "1e-05"), (1.5e-7, "1.5e-07"), (123456.789, "123456.789"),
                              (1e15, "1000000000000000.0"), (1e16, "1e+16"), (1.5e16, "1.5e+16"),
                              (9999999999999998.0, "9999999999999998.0"), (1e22, "1e+22"), (1e100, "1e+100"),
                              (f64::MAX, "1.7976931348623157e+308"), (5e-324, "5e-324"), (-2.5, "-2.5"),
                              (f64::INFINITY, "inf"), (f64::NAN, "nan"), (1.0 / 3.0, "0.3333333333333333")] {
            assert_eq!(python_float_repr(value), repr, "{value:e}");
        }
    }

    #[test]
    fn floats_are_written_as_prometheus_client_writes_them() {
        // (value, floatToGoString(value)) from prometheus_client 0.26
        for (value, go) in [(1.0, "1.0"), (123456.0, "123456.0"), (1234567.0, "1.234567e+06"),
                            (1000000.0, "1e+06"), (1234567.5, "1.2345675e+06"), (10000000.5, "1.00000005e+07"),
                            (1e16, "1e+16"), (-1234567.0, "-1234567.0"), (f64::INFINITY, "+Inf"),
                            (f64::NEG_INFINITY, "-Inf"), (f64::NAN, "NaN"), (7.65e-06, "7.65e-06")] {
            assert_eq!(float_to_go_string(value), go, "{value:e}");
        }
    }

    #[test]
    fn families_are_encoded_with_their_labels_sorted_and_escaped() {
        let family = MetricFamily {
            name: "x_requests".into(),
            documentation: "Say \"hi\"\\n\nnext".into(),
            kind: "counter",
            unit: String::new(),
            samples: vec![
                Sample { name: "x_requests_total".into(),
                         labels: vec![("model_name".into(), "a\"b\\c\nd".into()), ("engine_kind".into(), "vllm".into())],
                         value: 2.0 },
                Sample { name: "x_requests_total".into(), labels: vec![], value: 0.5 },
            ],
        };
        let mut text = String::new();
        encode(&family, false, &mut text);
        assert_eq!(text, "# HELP x_requests_total Say \"hi\"\\\\n\\nnext\n# TYPE x_requests_total counter\n\
                          x_requests_total{engine_kind=\"vllm\",model_name=\"a\\\"b\\\\c\\nd\"} 2.0\n\
                          x_requests_total 0.5\n");
        let mut open = String::new();
        encode(&family, true, &mut open);
        assert!(open.starts_with("# HELP x_requests Say \\\"hi\\\"\\\\n\\nnext\n# TYPE x_requests counter\n"), "{open}");
        assert!(legacy_name("vllm:x_1", true) && !legacy_name("vllm:x", false) && !legacy_name("1x", true));
        assert!(!legacy_name("", false) && !legacy_name("a.b", true));
    }
}
