//! The accounting corpus (`tests/data/accounting/corpus.json`, written by the Python reference with
//! `tests/data/accounting/generate.py`): each case's records through `accounting::Accounting`; at
//! each checkpoint the exposition (text 0.0.4 and OpenMetrics), the byte budget used and every
//! family's overflow count must be Python's, byte for byte.

use std::borrow::Cow;
use std::collections::HashMap;

use otel_llm_engine::accounting::{Accounting, AccountingSettings, AccountingSpec, AccountingSpecs, Objectives, Price,
                                  SeriesBudget};
use otel_llm_engine::record::{Record, Side};
use serde_json::Value;

mod common;

use common::{float, text};

fn objectives(value: &Value) -> Option<Objectives> {
    value.as_object()?;
    Some(Objectives { ttft_s: float(&value["ttft_s"]), tpot_s: float(&value["tpot_s"]), e2e_s: float(&value["e2e_s"]),
                      target: float(&value["target"]) })
}

fn settings(value: &Value) -> AccountingSettings {
    AccountingSettings {
        tokens: value["tokens"].as_bool().unwrap(),
        currency: text(&value["currency"]).to_owned(),
        prices: value["prices"].as_object().unwrap().iter().map(|(model, price)| {
            (model.clone(), Price { input: float(&price["input"]), output: float(&price["output"]),
                                    cached_input: float(&price["cached_input"]) })
        }).collect(),
        default_objectives: objectives(&value["default_objectives"]),
        objectives_by_model: value["objectives_by_model"].as_object().unwrap().iter()
            .map(|(model, o)| (model.clone(), objectives(o).unwrap())).collect(),
    }
}

fn specs(corpus: &Value) -> AccountingSpecs {
    let spec = |position: usize| {
        let name = text(&corpus["families"][position]);
        let declared = &corpus["specs"][name];
        AccountingSpec {
            name: name.to_owned(),
            description: text(&declared["description"]).to_owned(),
            label_names: declared["label_names"].as_array().unwrap().iter().map(|n| text(n).to_owned()).collect(),
        }
    };
    AccountingSpecs { tenant_tokens: spec(0), request_cost: spec(1), unpriced_tokens: spec(2), slo_requests: spec(3),
                      slo_target: spec(4) }
}

/// `[model, tenant, engine_kind, side, joined_span_id (hex), outcome, weight, prompt_tokens,
/// cached_tokens, completion_tokens, ttft_s, tpot_s, e2e_s]`.
fn record(value: &Value) -> Record<'_> {
    let mut record = Record::new([1; 16], [2; 8]);
    record.model = Cow::Borrowed(text(&value[0]));
    record.tenant = Cow::Borrowed(text(&value[1]));
    record.engine_kind = Cow::Borrowed(text(&value[2]));
    record.side = Side::parse(text(&value[3])).unwrap();
    let joined = text(&value[4]);
    record.joined_span_id = (!joined.is_empty()).then(|| common::hex_bytes(joined));
    record.outcome = Cow::Borrowed(text(&value[5]));
    record.weight = float(&value[6]).unwrap();
    record.prompt_tokens = value[7].as_i64();
    record.cached_tokens = value[8].as_i64();
    record.completion_tokens = value[9].as_i64();
    record.ttft_s = float(&value[10]);
    record.tpot_s = float(&value[11]);
    record.e2e_s = float(&value[12]);
    record
}

#[test]
fn the_exposition_budget_and_overflow_are_the_python_references() {
    let corpus = common::corpus("accounting");
    let overflow: Vec<(String, String)> = corpus["overflow_labels"].as_object().unwrap().iter()
        .map(|(k, v)| (k.clone(), text(v).to_owned())).collect();
    let overflow: Vec<(&str, &str)> = overflow.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut checked = 0;
    for case in corpus["cases"].as_array().unwrap() {
        let name = text(&case["name"]);
        let mut accounting = Accounting::new(settings(&case["settings"]), specs(&corpus),
                                             case["series_limit"].as_u64().unwrap() as usize,
                                             case["max_label_value_bytes"].as_u64().unwrap() as usize).unwrap();
        let mut budget = SeriesBudget { limit: case["budget_bytes"].as_u64().unwrap(), used: 0 };
        let records = case["records"].as_array().unwrap();
        let mut done = 0;
        for checkpoint in case["checkpoints"].as_array().unwrap() {
            let after = checkpoint["after"].as_u64().unwrap() as usize;
            for value in &records[done..after] {
                accounting.record(&record(value), &mut budget);
            }
            done = after;
            let mut text_004 = String::new();
            accounting.render(false, &overflow, &mut text_004);
            assert_eq!(text_004, text(&checkpoint["text"]), "{name}, after {after} records: text 0.0.4");
            let mut open = String::new();
            accounting.render(true, &overflow, &mut open);
            assert_eq!(open, text(&checkpoint["openmetrics"]), "{name}, after {after} records: OpenMetrics");
            assert_eq!(budget.used, checkpoint["budget_used"].as_u64().unwrap(), "{name}, after {after}: budget");
            let expected: HashMap<&str, u64> = checkpoint["overflowed"].as_object().unwrap().iter()
                .map(|(k, v)| (k.as_str(), v.as_u64().unwrap())).collect();
            let got: HashMap<&str, u64> = accounting.overflowed().into_iter().collect();
            assert_eq!(got, expected, "{name}, after {after}: overflowed");
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} checkpoints");
}
