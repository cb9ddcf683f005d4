//! The engine's hand-offs with Python (`handoff`) on the end-to-end corpus (`tests/data/engine`,
//! see `engine_declared.rs`): every request is read by the engine (`ingest`) in one engine, and in
//! another handed over as Python would hand it: its spans read back (`Engine::spans_of`, what Python
//! gets of a declined trace) from a scratch engine that read it, then supplied (`Engine::supply`,
//! what Python gives of a request it read). Both engines, drained, must render the same exposition
//! byte for byte (and the reference's samples), make the same decisions and write the same kept
//! traces: a supplied span is buffered exactly as a read one, and nothing is lost on the way back.
//! And `tests/data/handoff/corpus.json.gz` (its `generate.py`): requests the engine leaves to Python,
//! supplied as the reference digest read them, give the reference pipeline's exposition.

use std::collections::HashMap;

use otel_llm_engine::declaration::engine_config;
use otel_llm_engine::engine::{Engine, IngestCounts, IngestSummary, TickOutput};
use otel_llm_engine::handoff::{ObservationData, OriginData, SpanData, SpansData};
use otel_llm_engine::model::Value;
use otel_llm_engine::wire::scan;
use serde_json::Value as Json;

mod replay;

use replay::{hex, load, samples};

fn corpus() -> Json {
    load("tests/data/engine/corpus.json.gz")
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

/// `SpansData` as `tests/data/handoff/generate.py` writes what the binding makes of Python's
/// `BufferedSpan`s (bytes as hex, a field as [name, kind, value]).
fn spans_data(json: &Json) -> SpansData {
    let text = |v: &Json| v.as_str().unwrap().to_owned();
    let origins = json["origins"].as_array().unwrap().iter()
        .map(|o| OriginData { resource: hex(o[0].as_str().unwrap()), scope: hex(o[1].as_str().unwrap()),
                              service_name: text(&o[2]) })
        .collect();
    let value = |kind: &str, v: &Json| match kind {
        "float" => Value::Float(v.as_f64().unwrap()),
        "int" => Value::Int(v.as_i64().unwrap()),
        "text" => Value::Text(text(v)),
        "flag" => Value::Flag(v.as_bool().unwrap()),
        "floats" => Value::Floats(v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()),
        "texts" => Value::Texts(v.as_array().unwrap().iter().map(text).collect()),
        other => panic!("kind {other}"),
    };
    let spans = json["spans"].as_array().unwrap().iter().map(|s| SpanData {
        trace_id: hex(s[0].as_str().unwrap()),
        span_id: hex(s[1].as_str().unwrap()),
        parent_span_id: hex(s[2].as_str().unwrap()),
        kind: s[3].as_i64().unwrap() as i32,
        status_code: s[4].as_i64().unwrap() as i32,
        start_unix_ns: s[5].as_u64().unwrap(),
        end_unix_ns: s[6].as_u64().unwrap(),
        trace_state: text(&s[7]),
        payload: hex(s[8].as_str().unwrap()),
        origin: s[9].as_u64().unwrap() as usize,
        attrs_kept: s[10].as_bool().unwrap(),
        observation: (!s[11].is_null()).then(|| ObservationData {
            adapter: text(&s[11][0]),
            fields: s[11][1].as_array().unwrap().iter()
                .map(|f| (text(&f[0]), value(f[1].as_str().unwrap(), &f[2]))).collect(),
        }),
    }).collect();
    SpansData { origins, spans }
}

#[test]
fn what_python_s_digest_supplies_gives_the_reference_pipeline_s_exposition() {
    let corpus = load("tests/data/handoff/corpus.json.gz");
    let declaration = serde_json::to_string(&corpus["declaration"]).unwrap();
    let engine = Engine::new(engine_config(&declaration).unwrap()).unwrap();
    let (mut supplied, mut read, mut itl) = (0, 0, 0);
    for request in corpus["requests"].as_array().unwrap() {
        let label = request[0].as_str().unwrap();
        let data = hex(request[1].as_str().unwrap());
        match engine.ingest(&data, false, 0.0).unwrap() {
            IngestSummary::Native(_) => {
                assert!(label.starts_with("native:"), "{label} was read natively");
                read += 1;
            }
            IngestSummary::Python => {
                assert!(label.starts_with("python:"), "{label} was left to Python");
                let spans = spans_data(&request[2]);
                itl += spans.spans.iter().filter_map(|s| s.observation.as_ref())
                    .filter(|o| o.fields.iter().any(|(name, _)| name == "itl_s")).count();
                let counts = engine.supply(&spans, 0.0).unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_eq!(counts.buffered, spans.spans.len() as u64, "{label}");
                supplied += 1;
            }
        }
    }
    assert_eq!((supplied, read), (3, 2));
    assert!(itl >= 1, "the token events' latencies were supplied");
    engine.drain();
    let out = engine.tick_at(0.0, 0.0);
    assert!(out.declined.is_empty(), "{:?}", out.declined.iter().map(|(_, r)| r).collect::<Vec<_>>());
    let wanted = samples(corpus["exposition"].as_str().unwrap());
    let got = samples(&engine.render(false));
    let missing: Vec<&String> = wanted.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !wanted.contains_key(*k)).collect();
    eprintln!("{supplied} requests supplied, {read} read; {} records measured; {} samples expected, {} missing, {} extra",
              out.records_measured, wanted.len(), missing.len(), extra.len());
    assert!(missing.is_empty() && extra.is_empty(), "missing {:#?}\nextra {:#?}",
            &missing[..missing.len().min(10)], &extra[..extra.len().min(10)]);
    assert_eq!(got, wanted);
}
