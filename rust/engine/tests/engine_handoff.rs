//! The engine's hand-offs with Python (`handoff`) on the end-to-end corpus (`tests/data/engine`,
//! see `engine_declared.rs`): every request is read by the engine (`ingest`) in one engine, and in
//! another handed over as Python would hand it: its spans read back (`Engine::spans_of`, what Python
//! gets of a declined trace) from a scratch engine that read it, then supplied (`Engine::supply`,
//! what Python gives of a request it read). Both engines, drained, must render the same exposition
//! byte for byte (and the reference's samples), make the same decisions and write the same kept
//! traces: a supplied span is buffered exactly as a read one, and nothing is lost on the way back.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Read as _;
use std::path::Path;

use flate2::read::GzDecoder;
use otel_llm_engine::declaration::engine_config;
use otel_llm_engine::engine::{Engine, IngestCounts, IngestSummary, TickOutput};
use otel_llm_engine::handoff::{SpanData, SpansData};
use otel_llm_engine::wire::scan;
use serde_json::Value as Json;

fn corpus() -> Json {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/engine/corpus.json.gz");
    let mut text = String::new();
    GzDecoder::new(fs::File::open(path).unwrap()).read_to_string(&mut text).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

fn samples(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        *out.entry(line.to_owned()).or_insert(0) += 1;
    }
    out
}

fn native(engine: &Engine, data: &[u8]) -> IngestCounts {
    match engine.ingest(data, false, 0.0).unwrap() {
        IngestSummary::Native(counts) => counts,
        IngestSummary::Python => panic!("the corpus holds only what the engine reads"),
    }
}

/// The request's spans as the engine buffered them, read back with `spans_of` from a scratch
/// engine, in the request's order (the first copy's place for a span sent twice).
fn read_back(scratch: &Engine, data: &[u8]) -> SpansData {
    native(scratch, data);
    let (_, rows) = scan(data, false).unwrap();
    let mut order: HashMap<(Vec<u8>, Vec<u8>), usize> = HashMap::new();
    for (at, row) in rows.iter().enumerate() {
        let key = (data[row.trace_id.0..row.trace_id.1].to_vec(), data[row.span_id.0..row.span_id.1].to_vec());
        order.entry(key).or_insert(at);
    }
    let mut out = SpansData::default();
    let mut spans: Vec<SpanData> = Vec::new();
    for trace in scratch.take_pending(|_| true) {
        let back = scratch.spans_of(&trace);
        let base = out.origins.len();
        out.origins.extend(back.origins);
        spans.extend(back.spans.into_iter().map(|span| SpanData { origin: base + span.origin, ..span }));
    }
    spans.sort_by_key(|span| order[&(span.trace_id.clone(), span.span_id.clone())]);
    out.spans = spans;
    out
}

fn kept(out: &TickOutput) -> Vec<String> {
    out.kept.iter().map(|k| format!("{:?} {:?} {:?} {:?}", k.trace_id, k.written.request, k.written.rows, k.decision)).collect()
}

#[test]
fn requests_handed_over_through_python_give_what_the_engine_reading_them_gives() {
    let corpus = corpus();
    let requests: Vec<(String, Vec<u8>)> = corpus["requests"].as_array().unwrap().iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), hex(r[1].as_str().unwrap()))).collect();
    for (name, scenario) in corpus["scenarios"].as_object().unwrap() {
        let declaration = serde_json::to_string(&scenario["declaration"]).unwrap();
        let mut config = engine_config(&declaration).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Kept traces written too (the corpus's pipeline has no consumer of them): their bytes compared.
        config.write_kept = true;
        let read = Engine::new(config.clone()).unwrap();
        let handed = Engine::new(config.clone()).unwrap();
        let mut spans = 0;
        for (label, data) in &requests {
            let counts = native(&read, data);
            let scratch = Engine::new(config.clone()).unwrap();
            let supplied_spans = read_back(&scratch, data);
            spans += supplied_spans.spans.len();
            let supplied = handed.supply(&supplied_spans, 0.0).unwrap_or_else(|e| panic!("{name} {label}: {e}"));
            // What the scratch engine did not buffer (a duplicate, ids refused, past the trace's
            // limit) is not handed back: the rest is counted as ingest counts it.
            assert_eq!(IngestCounts { malformed: Vec::new(), invalid_ids: 0, duplicate: 0, dropped_over_trace_limit: 0,
                                      buffered: 0, ..supplied.clone() },
                       IngestCounts { malformed: Vec::new(), invalid_ids: 0, duplicate: 0, dropped_over_trace_limit: 0,
                                      buffered: 0, ..counts.clone() }, "{name} {label}");
            assert_eq!(supplied.buffered, counts.buffered - counts.duplicate - counts.dropped_over_trace_limit,
                       "{name} {label}");
        }
        assert_eq!((read.len(), read.held_spans()), (handed.len(), handed.held_spans()), "{name}");
        read.drain();
        handed.drain();
        let (a, b) = (read.tick_at(0.0, 0.0), handed.tick_at(0.0, 0.0));
        eprintln!("{name}: {} requests, {spans} spans handed over; {} records measured, {} kept written, \
                   {} declined", requests.len(), b.records_measured, b.kept.len(), b.declined.len());
        assert_eq!((a.records_built, a.records_measured, a.kept_decisions, a.dropped_decisions, a.rate_limited),
                   (b.records_built, b.records_measured, b.kept_decisions, b.dropped_decisions, b.rate_limited), "{name}");
        assert_eq!((a.completed.clone(), a.late, a.declined.len(), a.kept_declined.len()),
                   (b.completed.clone(), b.late, b.declined.len(), b.kept_declined.len()), "{name}");
        assert_eq!((a.assembled.clone(), a.values_rejected.clone(), a.unmeasured.clone(), a.malformed.clone()),
                   (b.assembled.clone(), b.values_rejected.clone(), b.unmeasured.clone(), b.malformed.clone()), "{name}");
        assert_eq!(kept(&a), kept(&b), "{name}: kept traces written");
        assert_eq!(read.render(false), handed.render(false), "{name}");
        assert_eq!(read.render(true), handed.render(true), "{name}");
        assert_eq!(samples(&handed.render(false)), samples(scenario["exposition"].as_str().unwrap()),
                   "{name}: the reference's samples");
        let (x, y) = (read.counters(), handed.counters());
        assert_eq!((x.kept, x.dropped, x.rate_limited, x.kept_written), (y.kept, y.dropped, y.rate_limited, y.kept_written));
        assert_eq!((y.requests_native, y.requests_supplied), (0, requests.len() as u64));
        assert!(spans > 0 && b.records_measured > 0 && !b.kept.is_empty(), "{name}");
    }
}
