//! The engine's `KeptWriter` against the Python reference's own kept traces: every case of the
//! corpus `tests/data/kept/generate.py` wrote (the engine fixtures, the emitter captures, the bench
//! workload, seeded hostile traces and byte-level mutations, each kept by `synthesis.kept_trace`
//! under a redaction, a policy and a threshold) is written here from the trace as the engine
//! buffers it, and must give Python's export request byte for byte, its span count, its store rows
//! value for value and its redaction counts; or be declined, only where the case says its input
//! holds what the engine leaves to Python (and always where Python raised).

use std::collections::{BTreeMap, HashMap};

use otel_llm_engine::kept::{Decline, KeptWriter, SpanRowOut};
use serde_json::Value as Json;

#[allow(dead_code)] // `corpus` reads the plain `corpus.json` files; this corpus is gzipped
mod common;
#[path = "common/kept_corpus.rs"]
mod kept_corpus;

use kept_corpus::{hex_of, strings, Corpus};

fn row_json(row: &SpanRowOut) -> Json {
    serde_json::json!([row.trace_id, row.span_id, row.parent_span_id, row.name, row.kind, row.service_name,
                       row.start_unix_ns, row.end_unix_ns, row.status_code, row.status_message, row.attributes_json])
}

/// What a decline's reason must be found in the case's input as.
fn oddity(decline: Decline) -> &'static str {
    match decline {
        Decline::RepeatedKey => "repeated_key",
        Decline::FieldTwice => "field_twice",
        Decline::ValueShape => "value_shape",
        Decline::Malformed | Decline::SegmentTime | Decline::Origins => "python raises",
    }
}

#[derive(Debug, Default)]
struct Tally {
    written: usize,
    declined: BTreeMap<&'static str, usize>,
    raised: usize,
    segments: usize,
    counts: [u64; 5],
}

/// Every case of corpus `name`, compared; what was written and declined.
fn replay(name: &str) -> Tally {
    let corpus = Corpus::load(name);
    let mut writers: HashMap<&str, KeptWriter> = corpus.redactions.iter()
        .map(|(name, redaction)| (name.as_str(), KeptWriter::new(redaction).unwrap())).collect();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for case in &corpus.cases {
        let label = format!("{} [{} {:?} {:?}]", common::text(&case["name"]), common::text(&case["redaction"]),
                            common::text(&case["policy"]), common::text(&case["threshold"]));
        let (data, records) = &corpus.traces[case["trace"].as_u64().unwrap() as usize];
        let writer = writers.get_mut(common::text(&case["redaction"])).unwrap();
        let written = writer.write(data, records, common::text(&case["policy"]), common::text(&case["threshold"]));
        let expected = &case["expected"];
        let may_decline = strings(&case["may_decline"]);
        match written {
            Err(decline) => {
                let why = oddity(decline);
                let allowed = may_decline.iter().any(|m| m == why || m == "fuzz")
                    || (why == "python raises" && !expected["raises"].is_null());
                if !allowed && expected["raises"].is_null() {
                    failures.push(format!("{label}: declined ({decline:?}) what Python writes; its oddities: {may_decline:?}"));
                }
                *tally.declined.entry(decline.as_str()).or_default() += 1;
                tally.raised += usize::from(!expected["raises"].is_null());
            }
            Ok(_) if !expected["raises"].is_null() => {
                failures.push(format!("{label}: Python raised {}, the engine wrote it", expected["raises"]));
            }
            Ok(out) => {
                tally.written += 1;
                let request = hex_of(&out.request);
                let wanted = common::text(&expected["request"]);
                if request != wanted {
                    let at = request.bytes().zip(wanted.bytes()).position(|(a, b)| a != b).unwrap_or(0) / 2;
                    failures.push(format!("{label}: request differs from byte {at} (lengths {} and {})\n  engine: {}\n  python: {}",
                                          request.len() / 2, wanted.len() / 2,
                                          &request[(2 * at).saturating_sub(40)..(2 * at + 80).min(request.len())],
                                          &wanted[(2 * at).saturating_sub(40)..(2 * at + 80).min(wanted.len())]));
                }
                if out.spans as u64 != expected["spans"].as_u64().unwrap() {
                    failures.push(format!("{label}: {} spans, Python {}", out.spans, expected["spans"]));
                }
                let rows: Vec<Json> = out.rows.iter().map(row_json).collect();
                let wanted_rows = expected["rows"].as_array().unwrap();
                if rows.len() != wanted_rows.len() {
                    failures.push(format!("{label}: {} rows, Python {}", rows.len(), wanted_rows.len()));
                }
                for (row, wanted) in rows.iter().zip(wanted_rows) {
                    if row != wanted {
                        failures.push(format!("{label}: row\n  engine: {row}\n  python: {wanted}"));
                    }
                }
                let counts: Vec<u64> = out.redacted.by_reason().iter().map(|(_, n)| *n).collect();
                let wanted_counts: Vec<u64> = expected["counts"].as_array().unwrap().iter()
                    .map(|n| n.as_u64().unwrap()).collect();
                if counts != wanted_counts {
                    failures.push(format!("{label}: counts {counts:?}, Python {wanted_counts:?}"));
                }
                tally.segments += out.rows.iter().filter(|r| r.kind == 1 && r.attributes_json.starts_with("{\"otel_llm.segment\"")).count();
                for (total, n) in tally.counts.iter_mut().zip(counts) {
                    *total += n;
                }
            }
        }
    }
    if !failures.is_empty() {
        let shown: Vec<&String> = failures.iter().take(12).collect();
        panic!("{name}: {} differences from Python in {} cases:\n{}", failures.len(),
               corpus.cases.len(), shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"));
    }
    println!("{name}: {tally:?}");
    tally
}

#[test]
fn fixtures_and_captures_are_written_as_python_writes_them() {
    let tally = replay("fixtures");
    assert!(tally.written > 300 && tally.declined.is_empty(), "{tally:?}");
    assert!(tally.segments > 50, "{tally:?}");
}

#[test]
fn the_bench_workload_is_written_as_python_writes_it() {
    let tally = replay("bench");
    assert!(tally.written > 600 && tally.declined.is_empty(), "{tally:?}");
    assert!(tally.segments > 1000, "{tally:?}");
}

#[test]
fn hostile_traces_are_written_as_python_writes_them_or_declined_for_what_they_hold() {
    let tally = replay("random");
    // Every case without an oddity is written (replay fails otherwise); those with one may be.
    assert!(tally.written > 1100, "{tally:?}");
    for reason in ["repeated_key", "value_shape", "field_twice", "segment_time"] {
        assert!(tally.declined.get(reason).copied().unwrap_or(0) > 20, "{reason}: {tally:?}");
    }
    assert!(tally.counts.iter().all(|n| *n > 20), "every rule fired in what was written: {tally:?}");
}

#[test]
fn mutated_spans_are_declined_where_python_refuses_them_else_written_as_python_writes_them() {
    let tally = replay("mutations");
    assert!(tally.written > 500, "{tally:?}");
    assert!(tally.raised > 500, "{tally:?}");
}
