//! The `series` module against the Python reference (`MetricsRecorder(..., core=None)` exposed by
//! prometheus_client): the records of `tests/data/series/<scenario>/records.json`, recorded
//! natively, must render byte for byte the expositions Python wrote and hold the same state.
//! The data and how to regenerate it: `tests/data/series/generate.py`.

mod series_json;

use otel_llm_engine::series::exponential::{ExponentialBuckets, ExponentialState};
use otel_llm_engine::series::snapshot::{FamilySnapshot, SeriesValue};
use otel_llm_engine::series::Series;
use serde_json::Value;

use series_json::{data, float, floats, hex, metrics_spec, read_json, record, text};

/// The first line where two expositions differ, with its neighbours.
fn assert_same_exposition(actual: &[u8], expected: &[u8], what: &str) {
    if actual == expected {
        return;
    }
    let actual = String::from_utf8_lossy(actual);
    let expected = String::from_utf8_lossy(expected);
    let (a, e): (Vec<&str>, Vec<&str>) = (actual.lines().collect(), expected.lines().collect());
    let at = a.iter().zip(&e).position(|(x, y)| x != y).unwrap_or(a.len().min(e.len()));
    panic!(
        "{what}: differs at line {} of {} (expected {} lines)\n  expected: {:?}\n  actual:   {:?}\n  before:   {:?}",
        at + 1,
        a.len(),
        e.len(),
        e.get(at),
        a.get(at),
        at.checked_sub(1).and_then(|p| e.get(p))
    );
}

fn same_float(actual: f64, expected: f64) -> bool {
    actual.to_bits() == expected.to_bits() || (actual.is_nan() && expected.is_nan())
}

fn assert_floats(actual: &[f64], expected: &[f64], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(same_float(*a, *e), "{what}[{i}]: {a:?} != {e:?}");
    }
}

fn assert_buckets(actual: &ExponentialBuckets, expected: &Value, what: &str) {
    let entries = expected["entries"].as_array().unwrap();
    assert_eq!(actual.entries().len(), entries.len(), "{what}: buckets {:?} vs {entries:?}", actual.entries());
    for ((index, count), entry) in actual.entries().iter().zip(entries) {
        assert_eq!(*index, entry[0].as_i64().unwrap(), "{what}: index (Python's dict order)");
        assert!(same_float(*count, float(&entry[1])), "{what}: count of {index}: {count:?} vs {}", entry[1]);
    }
    if !entries.is_empty() {
        assert_eq!((actual.low(), actual.high()), (expected["low"].as_i64().unwrap(), expected["high"].as_i64().unwrap()), "{what}");
    }
}

fn assert_exponential(actual: &ExponentialState, expected: &Value, what: &str) {
    assert_eq!(actual.max_size as u64, expected["max_size"].as_u64().unwrap(), "{what}: max_size");
    assert_eq!(i64::from(actual.scale), expected["scale"].as_i64().unwrap(), "{what}: scale");
    assert!(same_float(actual.zero_count, float(&expected["zero_count"])), "{what}: zero count");
    assert_buckets(&actual.positive, &expected["positive"], &format!("{what} positive"));
    assert_buckets(&actual.negative, &expected["negative"], &format!("{what} negative"));
}

fn assert_family(actual: &FamilySnapshot, expected: &Value) {
    let name = text(&expected["name"]);
    assert_eq!(actual.name, name);
    let series = expected["series"].as_array().unwrap();
    assert_eq!(actual.series.len(), series.len(), "{name}: series");
    for (s, e) in actual.series.iter().zip(series) {
        let key: Vec<String> = e["key"].as_array().unwrap().iter().map(text).collect();
        assert_eq!(s.key, key, "{name}: series order and keys");
        let what = format!("{name}{key:?}");
        match &s.value {
            SeriesValue::Counter(value) => assert!(same_float(*value, float(&e["value"])), "{what}: {value:?} vs {}", e["value"]),
            SeriesValue::Histogram(point) => {
                assert_floats(&point.counts, &floats(&e["counts"]), &format!("{what} counts"));
                assert!(same_float(point.sum, float(&e["sum"])), "{what}: sum {:?} vs {}", point.sum, e["sum"]);
                assert!(same_float(point.count, float(&e["count"])), "{what}: count");
                assert_floats(&point.bounds, &floats(&e["bounds"]), &format!("{what} bounds"));
                let exemplars = e["exemplars"].as_array().unwrap();
                assert_eq!(point.exemplars.len(), exemplars.len(), "{what}: exemplars");
                for ((index, exemplar), x) in point.exemplars.iter().zip(exemplars) {
                    assert_eq!(*index as u64, x[0].as_u64().unwrap(), "{what}: exemplar bucket");
                    assert_eq!(exemplar.trace_id, hex::<16>(&x[1]), "{what}: exemplar trace");
                    assert_eq!(exemplar.span_id, hex::<8>(&x[2]), "{what}: exemplar span");
                    assert!(same_float(exemplar.value, float(&x[3])), "{what}: exemplar value");
                    assert!(same_float(exemplar.timestamp, float(&x[4])), "{what}: exemplar time");
                }
                match (&point.exponential, &e["exponential"]) {
                    (None, Value::Null) => {}
                    (Some(state), expected) if !expected.is_null() => {
                        assert_exponential(state, expected, &what);
                        assert_exponential(&state.fitted(16, 2), &e["fitted"], &format!("{what} fitted"));
                    }
                    (actual, expected) => panic!("{what}: exponential {actual:?} vs {expected}"),
                }
            }
        }
    }
}

fn check_scenario(scenario: &str) {
    let directory = data(scenario);
    let spec = metrics_spec(&read_json(&directory.join("spec.json")));
    let mut series = Series::new(&spec).expect("the declared metrics are recorded natively");
    let records = read_json(&directory.join("records.json"));
    for json in records.as_array().unwrap() {
        series.record(&record(json), json["_with_exemplars"].as_bool().unwrap(), float(&json["_now"]));
    }
    assert_eq!(series.not_a_number(), 0);

    let mut plain = Vec::new();
    series.render(false, &mut plain);
    assert_same_exposition(&plain, &std::fs::read(directory.join("metrics.txt")).unwrap(), &format!("{scenario} text"));
    let mut om = Vec::new();
    series.render(true, &mut om);
    let expected = std::fs::read(directory.join("metrics.om")).unwrap();
    let expected = expected.strip_suffix(b"# EOF\n").expect("OpenMetrics ends with # EOF");
    assert_same_exposition(&om, expected, &format!("{scenario} OpenMetrics"));

    let snapshot = series.snapshot();
    let expected = read_json(&directory.join("snapshot.json"));
    let families = expected["families"].as_array().unwrap();
    assert_eq!(snapshot.families.len(), families.len());
    for (actual, expected) in snapshot.families.iter().zip(families) {
        assert_family(actual, expected);
    }
    let too_long: Vec<(String, u64)> =
        expected["too_long"].as_array().unwrap().iter().map(|p| (text(&p[0]), p[1].as_u64().unwrap())).collect();
    assert_eq!(snapshot.too_long, too_long);
    assert_eq!(snapshot.budget_used, expected["budget_used"].as_u64().unwrap());
    assert_eq!(snapshot.budget_limit, expected["budget_limit"].as_u64().unwrap());
    assert_eq!(snapshot.requests_recorded, expected["requests_recorded"].as_u64().unwrap());
}

#[test]
fn every_naming_renders_as_the_python_recorder() {
    check_scenario("every_naming");
}

#[test]
fn genai_0_1_renders_as_the_python_recorder() {
    check_scenario("genai_0_1");
}

/// Three series per family, a small byte budget, 16-byte label values and 4 exponential buckets:
/// overflow, budget exhaustion, too-long labels and downscaling, as Python does them.
#[test]
fn tight_limits_render_as_the_python_recorder() {
    check_scenario("tight");
}

/// One series per family and label keys past the caches' bound (68 entries): the caches are
/// cleared as Python's are, without changing what is recorded.
#[test]
fn a_key_flood_renders_as_the_python_recorder() {
    check_scenario("key_flood");
}
