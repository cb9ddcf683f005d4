//! The decide corpus (`tests/data/decide/corpus.json`, written by the Python reference with
//! `tests/data/decide/generate.py`): each case's traces, batch by batch at the batch's instant,
//! through `decide::Sampler`; every decision (its policy, threshold, keep and rate-limited) or
//! failure must be Python's.

use std::borrow::Cow;

use otel_llm_engine::decide::{DecideError, PolicyConfig, PolicyMetric, Rule, Sampler, SamplerConfig};
use otel_llm_engine::model::{Names, NewSpan, TraceData, SPAN_KIND_SERVER};
use otel_llm_engine::record::{Record, Side};
use serde_json::Value;

mod common;

use common::{float, text};

fn metric(name: &str) -> PolicyMetric {
    PolicyMetric::parse(name).unwrap_or_else(|| panic!("no policy metric {name}"))
}

fn limits(value: &Value) -> Vec<(PolicyMetric, f64)> {
    value.as_object().unwrap().iter().map(|(name, limit)| (metric(name), float(limit).unwrap())).collect()
}

fn config(value: &Value) -> SamplerConfig {
    let policies = value["policies"].as_array().unwrap().iter().map(|policy| PolicyConfig {
        name: text(&policy["name"]).to_owned(),
        rule: match text(&policy["type"]) {
            "errors" => Rule::Errors,
            "slo" => Rule::Slo {
                thresholds: limits(&policy["thresholds"]),
                per_model: policy["per_model"].as_object().unwrap().iter()
                    .map(|(model, l)| (model.clone(), limits(l))).collect(),
            },
            "slowest" => Rule::Slowest {
                metrics: policy["metrics"].as_array().unwrap().iter().map(|m| metric(text(m))).collect(),
                quantile: float(&policy["quantile"]).unwrap(),
                window_s: float(&policy["window"]).unwrap(),
            },
            "probabilistic" => Rule::Probabilistic { sampling_percentage: float(&policy["sampling_percentage"]).unwrap() },
            other => panic!("policy type {other}"),
        },
    }).collect();
    SamplerConfig {
        policies,
        traces_per_second: float(&value["traces_per_second"]).unwrap(),
        per_model_traces_per_second: float(&value["per_model_traces_per_second"]).unwrap(),
        applies_to: value["applies_to"].as_array().unwrap().iter().map(|n| text(n).to_owned()).collect(),
        max_models: value["max_models"].as_u64().unwrap() as usize,
    }
}

fn trace(value: &Value) -> TraceData {
    let mut data = TraceData::new(common::hex_bytes(text(&value["trace_id"])));
    for (index, status) in value["statuses"].as_array().unwrap().iter().enumerate() {
        data.put(&NewSpan {
            span_id: [index as u8 + 1; 8], parent_span_id: None, kind: SPAN_KIND_SERVER,
            status_code: status.as_i64().unwrap() as i32, start_unix_ns: 1, end_unix_ns: 2, payload: b"",
            trace_state: "", resource: b"", scope: b"", service_name: "svc", observation: None, attrs_kept: true,
        });
    }
    data
}

/// `[model, outcome, side, ttft_s, tpot_s, e2e_s, queue_s, gateway_overhead_s]`.
fn record(value: &Value) -> Record<'_> {
    let mut record = Record::new([1; 16], [2; 8]);
    record.model = Cow::Borrowed(text(&value[0]));
    record.outcome = Cow::Borrowed(text(&value[1]));
    record.side = Side::parse(text(&value[2])).unwrap();
    record.ttft_s = float(&value[3]);
    record.tpot_s = float(&value[4]);
    record.e2e_s = float(&value[5]);
    record.queue_s = float(&value[6]);
    record.gateway_overhead_s = float(&value[7]);
    record
}

#[test]
fn every_decision_is_the_python_references() {
    let corpus = common::corpus("decide");
    let mut decided = 0;
    for case in corpus["cases"].as_array().unwrap() {
        let name = text(&case["name"]);
        let mut names = Names::default();
        let mut sampler = Sampler::new(&config(&case["config"]), &mut names, float(&case["start"]).unwrap()).unwrap();
        let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
        for (batch_index, batch) in case["batches"].as_array().unwrap().iter().enumerate() {
            let now = float(&batch["now"]).unwrap();
            for (index, expected_trace) in batch["traces"].as_array().unwrap().iter().enumerate() {
                let data = trace(expected_trace);
                let records: Vec<Record<'_>> = expected_trace["records"].as_array().unwrap().iter().map(record).collect();
                let expected = &expected_trace["expected"];
                let at = format!("{name}, batch {batch_index}, trace {index}");
                // [kept|dropped|rate_limited, policy, threshold], or ["error", class, message]
                let key = match sampler.decide(&data, &records, now) {
                    Ok(decision) => {
                        let outcome = match (decision.keep, decision.rate_limited) {
                            (_, true) => "rate_limited",
                            (true, false) => "kept",
                            (false, false) => "dropped",
                        };
                        assert_eq!(outcome, text(&expected[0]), "{at}: decided {decision:?}, Python {expected}");
                        assert_eq!(names.name(decision.policy), text(&expected[1]), "{at}");
                        assert_eq!(names.name(decision.threshold), text(&expected[2]), "{at}");
                        format!("{}:{outcome}", names.name(decision.policy))
                    }
                    Err(error) => {
                        let DecideError::Window { cause, .. } = error;
                        assert_eq!("error", text(&expected[0]), "{at}: failed ({error}), Python {expected}");
                        assert_eq!(cause.python_exception(), text(&expected[1]), "{at}: {error}");
                        assert_eq!(error.to_string(), text(&expected[2]), "{at}");
                        cause.python_exception().to_owned()
                    }
                };
                *seen.entry(key).or_default() += 1;
                decided += 1;
            }
        }
        // The corpus draws every outcome it says it drew (the generator's own tally).
        let tally: std::collections::BTreeMap<String, usize> = case["outcomes"].as_object().unwrap().iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as usize)).collect();
        assert_eq!(seen, tally, "{name}");
    }
    assert!(decided > 2500, "{decided} traces");
}
