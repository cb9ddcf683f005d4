//! The engine built from what Python declares, against the Python reference's pipeline: each
//! scenario of `tests/data/engine/corpus.json.gz` (see its `generate.py`) gives the JSON
//! `engine_declaration` writes for a configuration, the export requests sent, and what the
//! reference's `Pipeline` exposed for them once drained (its `llm_metrics` families in the text
//! format, every bucket) and decided. The engine is built through `declaration::engine_config`,
//! sent the same requests, drained; its `render` must be the reference's exposition line for line,
//! and its decisions the reference's.

use std::collections::BTreeMap;

use otel_llm_engine::declaration::engine_config;
use otel_llm_engine::engine::{Engine, IngestSummary};
use serde_json::Value as Json;

mod replay;

use replay::{hex, load, samples};

fn corpus() -> Json {
    load("tests/data/engine/corpus.json.gz")
}

#[test]
fn the_declared_engine_exposes_what_the_reference_pipeline_exposes() {
    let corpus = corpus();
    let requests: Vec<(String, Vec<u8>)> = corpus["requests"].as_array().unwrap().iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), hex(r[1].as_str().unwrap()))).collect();
    for (name, scenario) in corpus["scenarios"].as_object().unwrap() {
        let declaration = serde_json::to_string(&scenario["declaration"]).unwrap();
        let config = engine_config(&declaration).unwrap_or_else(|e| panic!("{name}: {e}"));
        let engine = Engine::new(config).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut python = Vec::new();
        for (label, data) in &requests {
            match engine.ingest(data, false, 0.0).unwrap_or_else(|e| panic!("{name} {label}: {e:?}")) {
                IngestSummary::Native(_) => {}
                IngestSummary::Python => python.push(label.clone()),
            }
        }
        engine.drain();
        let out = engine.tick_at(0.0, 0.0);
        let mut decisions: BTreeMap<String, u64> = BTreeMap::new();
        let counters = engine.counters();
        decisions.insert("kept".into(), counters.kept);
        decisions.insert("dropped".into(), counters.dropped);
        decisions.insert("rate_limited".into(), counters.rate_limited);
        let mut expected: BTreeMap<String, u64> = ["kept", "dropped", "rate_limited"].iter().map(|k| (k.to_string(), 0)).collect();
        for (key, n) in scenario["decisions"].as_object().unwrap() {
            let outcome = key.rsplit('/').next().unwrap().to_owned();
            *expected.entry(outcome).or_insert(0) += n.as_u64().unwrap();
        }
        let wanted = samples(scenario["exposition"].as_str().unwrap());
        let got = samples(&engine.render(false));
        let missing: Vec<&String> = wanted.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra: Vec<&String> = got.keys().filter(|k| !wanted.contains_key(*k)).collect();
        eprintln!("{name}: {} requests ({} read by Python: {python:?}), {} declined traces, {} samples expected, \
                   {} missing, {} extra; decisions {decisions:?} expected {expected:?}",
                  requests.len(), python.len(), out.declined.len(), wanted.len(), missing.len(), extra.len());
        assert!(python.is_empty() && out.declined.is_empty(), "{name}: the corpus holds only what the engine reads");
        assert!(missing.is_empty() && extra.is_empty(), "{name}: missing {:#?}\nextra {:#?}",
                &missing[..missing.len().min(10)], &extra[..extra.len().min(10)]);
        assert_eq!(decisions, expected, "{name}: decisions");
    }
}

#[test]
fn a_wrong_declaration_is_refused_naming_its_section() {
    let corpus = corpus();
    let declaration = serde_json::to_string(&corpus["scenarios"]["everything"]["declaration"]).unwrap();
    let refused = |from: &str, to: &str| {
        let changed = declaration.replacen(from, to, 1);
        assert_ne!(changed, declaration, "{from} is in the declaration");
        engine_config(&changed).err().unwrap_or_else(|| panic!("{to} accepted"))
    };
    assert!(refused("\"max_traces\":", "\"max_traces\":\"many\",\"x\":").contains("assembly: a count expected"));
    assert!(refused("\"type\":\"errors\"", "\"type\":\"lucky\"").contains("sampler.policies[0]: no policy type"));
    assert!(refused("{\"field\":\"", "{\"field\":\"no_such_").contains("RequestRecord has no field"));
    assert!(refused("\"currency\":", "\"currency\":1,\"x\":").contains("accounting: a string expected"));
    assert!(refused("\"key_prefixes\":", "\"key_prefixez\":").contains("redaction: no \"key_prefixes\""));
    assert!(refused("\"shards\":1", "\"shards\":-1").contains("shards: a count expected"));
    // Built, then refused by the engine itself: no shard at all.
    let zero = declaration.replacen("\"shards\":1", "\"shards\":0", 1);
    assert!(Engine::new(engine_config(&zero).unwrap()).err().unwrap().contains("shards"));
}
