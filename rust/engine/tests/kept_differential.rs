//! The engine's `KeptWriter` against the Python reference's own kept traces: every case of the
//! corpus `tests/data/kept/generate.py` wrote (the engine fixtures, the emitter captures, the bench
//! workload, seeded hostile traces and byte-level mutations, each kept by `synthesis.kept_trace`
//! under a redaction, a policy and a threshold) is written here from the trace as the engine
//! buffers it, and must give Python's export request byte for byte, its span count, its store rows
//! value for value and its redaction counts; or be declined, only where the case says its input
//! holds what the engine leaves to Python (and always where Python raised).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use flate2::read::GzDecoder;
use otel_llm_engine::kept::{Decline, KeptWriter, Redaction, SpanRowOut};
use otel_llm_engine::model::{NewSpan, TraceData};
use otel_llm_engine::record::{Record, Segment, Side};
use serde_json::Value as Json;

#[allow(dead_code)] // `corpus` reads the plain `corpus.json` files; this corpus is gzipped
mod common;

fn load(name: &str) -> Json {
    let path = format!("{}/tests/data/kept/{name}.json.gz", env!("CARGO_MANIFEST_DIR"));
    let mut text = String::new();
    GzDecoder::new(std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
        .read_to_string(&mut text).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn base64(text: &str) -> Vec<u8> {
    fn digit(c: u8) -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        let digits: Vec<u32> = chunk.iter().filter(|&&c| c != b'=').map(|&c| digit(c)).collect();
        let mut word = 0u32;
        for (i, d) in digits.iter().enumerate() {
            word |= d << (18 - 6 * i);
        }
        out.extend_from_slice(&word.to_be_bytes()[1..digits.len()]);
    }
    out
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn strings(json: &Json) -> Vec<String> {
    json.as_array().unwrap().iter().map(|v| common::text(v).to_owned()).collect()
}

fn redaction(json: &Json) -> Redaction {
    Redaction {
        key_prefixes: strings(&json["key_prefixes"]),
        key_patterns: strings(&json["key_patterns"]),
        event_names: strings(&json["event_names"]),
        max_free_text_bytes: json["max_free_text_bytes"].as_u64().unwrap() as usize,
        allowed_keys: strings(&json["allowed_keys"]),
        allowed_patterns: strings(&json["allowed_patterns"]),
        metadata_keys: (!json["metadata_keys"].is_null()).then(|| strings(&json["metadata_keys"])),
        url_keys: strings(&json["url_keys"]),
        status_message_key: common::text(&json["status_message_key"]).to_owned(),
        error_type_key: common::text(&json["error_type_key"]).to_owned(),
    }
}

fn owned(json: &Json) -> Cow<'static, str> {
    Cow::Owned(common::text(json).to_owned())
}

fn record(trace_id: [u8; 16], json: &Json) -> Record<'static> {
    let mut record = Record::new(trace_id, common::hex_bytes(common::text(&json["span_id"])));
    record.side = Side::parse(common::text(&json["side"])).unwrap();
    record.outcome = owned(&json["outcome"]);
    record.model_source = owned(&json["model_source"]);
    record.provider_name = owned(&json["provider_name"]);
    record.operation_source = owned(&json["operation_source"]);
    record.operation_name = owned(&json["operation_name"]);
    record.request_model = owned(&json["request_model"]);
    record.prompt_tokens = json["prompt_tokens"].as_i64();
    record.completion_tokens = json["completion_tokens"].as_i64();
    record.tpot_s = common::float(&json["tpot_s"]);
    record.gateway_overhead_s = common::float(&json["gateway_overhead_s"]);
    record.client_overhead_s = common::float(&json["client_overhead_s"]);
    let texts = |json: &Json| strings(json).into_iter().map(Cow::Owned).collect::<Vec<_>>();
    record.segments_missing = texts(&json["segments_missing"]);
    record.segments_derived = texts(&json["segments_derived"]);
    record.not_measurable = texts(&json["not_measurable"]);
    record.segments = json["segments"].as_array().unwrap().iter().map(|s| Segment {
        name: owned(&s[0]),
        start_unix_ns: s[1].as_i64().unwrap(),
        end_unix_ns: s[2].as_i64().unwrap(),
    }).collect();
    record.joined_span_id = json["joined_span_id"].as_str().map(common::hex_bytes);
    record
}

/// A trace as the engine's buffer holds it: each span put in arrival order, with its origin.
fn trace_data(json: &Json, origins: &[(Vec<u8>, Vec<u8>)]) -> TraceData {
    let trace_id: [u8; 16] = common::hex_bytes(common::text(&json["trace_id"]));
    let mut data = TraceData::new(trace_id);
    let spans = json["spans"].as_array().unwrap();
    for span in spans {
        let payload = base64(common::text(&span["payload"]));
        let (resource, scope) = &origins[span["origin"].as_u64().unwrap() as usize];
        data.put(&NewSpan {
            span_id: common::hex_bytes(common::text(&span["span_id"])),
            parent_span_id: span["parent"].as_str().map(common::hex_bytes),
            kind: span["kind"].as_i64().unwrap() as i32,
            status_code: 0,
            start_unix_ns: span["start"].as_u64().unwrap(),
            end_unix_ns: span["end"].as_u64().unwrap(),
            payload: &payload,
            trace_state: common::text(&span["trace_state"]),
            resource,
            scope,
            service_name: "",
            observation: None,
            attrs_kept: true,
        });
    }
    assert_eq!(data.len(), spans.len(), "span ids repeat in {}", json["trace_id"]);
    data
}

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
    let corpus = load(name);
    let mut writers: HashMap<String, KeptWriter> = HashMap::new();
    for (redaction_name, settings) in corpus["redactions"].as_object().unwrap() {
        writers.insert(redaction_name.clone(), KeptWriter::new(&redaction(settings)).unwrap());
    }
    let origins: Vec<(Vec<u8>, Vec<u8>)> = corpus["origins"].as_array().unwrap().iter()
        .map(|o| (base64(common::text(&o[0])), base64(common::text(&o[1])))).collect();
    let traces: Vec<(TraceData, Vec<Record<'static>>)> = corpus["traces"].as_array().unwrap().iter().map(|t| {
        let data = trace_data(t, &origins);
        let records = t["records"].as_array().unwrap().iter().map(|r| record(data.trace_id, r)).collect();
        (data, records)
    }).collect();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for case in corpus["cases"].as_array().unwrap() {
        let label = format!("{} [{} {:?} {:?}]", common::text(&case["name"]), common::text(&case["redaction"]),
                            common::text(&case["policy"]), common::text(&case["threshold"]));
        let (data, records) = &traces[case["trace"].as_u64().unwrap() as usize];
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
               corpus["cases"].as_array().unwrap().len(), shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"));
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
