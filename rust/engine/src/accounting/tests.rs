//! Each rule of the accounting on its own. Expected counts follow from the records and the rules
//! (`accounting.py`, DESIGN.md's accounting section); the differential corpus
//! (`tests/accounting_corpus.rs`) replays the Python reference's own exposition.

use std::borrow::Cow;

use super::*;
use crate::record::outcome;

const OVERFLOW: &[(&str, &str)] = &[("otel_metric_overflow", "true")];

fn spec(name: &str, labels: &[&str]) -> AccountingSpec {
    AccountingSpec { name: name.into(), description: format!("{name}'s description"),
                     label_names: labels.iter().map(|l| l.to_string()).collect() }
}

fn specs() -> AccountingSpecs {
    AccountingSpecs {
        tenant_tokens: spec("otel_llm_tenant_tokens", &["model_name", "tenant", "token_type"]),
        request_cost: spec("otel_llm_request_cost", &["model_name", "tenant", "currency"]),
        unpriced_tokens: spec("otel_llm_unpriced_tokens", &["model_name", "tenant", "token_type"]),
        slo_requests: spec("otel_llm_slo_requests", &["model_name", "engine_kind", "slo"]),
        slo_target: spec("otel_llm_slo_target_ratio", &["model_name"]),
    }
}

fn objectives(ttft: Option<f64>, e2e: Option<f64>, target: Option<f64>) -> Objectives {
    Objectives { ttft_s: ttft, tpot_s: None, e2e_s: e2e, target }
}

fn record(model: &str, tenant: &str) -> Record<'static> {
    let mut record = Record::new([1; 16], [2; 8]);
    record.model = Cow::Owned(model.into());
    record.tenant = Cow::Owned(tenant.into());
    record.engine_kind = Cow::Borrowed("vllm");
    record.outcome = Cow::Borrowed(outcome::STOP);
    record
}

fn tokens(model: &str, tenant: &str, prompt: Option<i64>, cached: Option<i64>, completion: Option<i64>) -> Record<'static> {
    let mut record = record(model, tenant);
    record.prompt_tokens = prompt;
    record.cached_tokens = cached;
    record.completion_tokens = completion;
    record
}

fn timed(model: &str, ttft: Option<f64>, e2e: Option<f64>) -> Record<'static> {
    let mut record = record(model, "");
    record.ttft_s = ttft;
    record.e2e_s = e2e;
    record
}

fn priced(prices: &[(&str, Price)]) -> AccountingSettings {
    AccountingSettings {
        tokens: true,
        currency: "USD".into(),
        prices: prices.iter().map(|(m, p)| (m.to_string(), *p)).collect(),
        ..AccountingSettings::default()
    }
}

fn accounting(settings: AccountingSettings, series_limit: usize) -> Accounting {
    Accounting::new(settings, specs(), series_limit, 256).unwrap()
}

fn unlimited() -> SeriesBudget {
    SeriesBudget { limit: u64::MAX, used: 0 }
}

/// (sample labels sorted by name, joined, -> value) of one family of the snapshot.
fn samples(accounting: &Accounting, family: &str) -> Vec<(String, f64)> {
    accounting.snapshot(OVERFLOW).into_iter().filter(|f| f.name == family).flat_map(|f| f.samples).map(|sample| {
        let mut labels = sample.labels.clone();
        labels.sort();
        (labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","), sample.value)
    }).collect()
}

fn labels(text: &str, value: f64) -> (String, f64) {
    (text.to_owned(), value)
}

#[test]
fn slo_status_is_missed_above_a_threshold_or_failed_unmeasured_without_a_value_else_met() {
    let both = objectives(Some(1.0), Some(10.0), None);
    assert_eq!(slo_status(&timed("m", Some(1.0), Some(10.0)), &both), MET, "equal to the threshold meets it");
    assert_eq!(slo_status(&timed("m", Some(1.0000001), Some(1.0)), &both), MISSED);
    assert_eq!(slo_status(&timed("m", None, Some(1.0)), &both), UNMEASURED);
    assert_eq!(slo_status(&timed("m", None, Some(11.0)), &both), MISSED, "a miss after an unmeasured one");
    assert_eq!(slo_status(&timed("m", Some(f64::NAN), Some(1.0)), &both), MET, "NaN exceeds nothing");
    assert_eq!(slo_status(&timed("m", Some(f64::INFINITY), Some(1.0)), &both), MISSED);
    assert_eq!(slo_status(&timed("m", Some(5.0), None), &objectives(None, Some(10.0), None)), UNMEASURED);
    for failed in [outcome::ABORT, outcome::ERROR] {
        let mut record = timed("m", Some(0.1), Some(0.1));
        record.outcome = Cow::Borrowed(failed);
        assert_eq!(slo_status(&record, &both), MISSED);
    }
}

#[test]
fn tokens_split_into_uncached_cached_and_output_where_the_cached_count_fits_the_prompt() {
    let split = |p, c, o| token_split(&tokens("m", "t", p, c, o));
    assert_eq!(split(Some(100), Some(30), Some(7)), [Some(70), Some(30), Some(7)]);
    assert_eq!(split(Some(100), Some(100), None), [Some(0), Some(100), None]);
    assert_eq!(split(Some(100), Some(0), None), [Some(100), Some(0), None]);
    assert_eq!(split(Some(100), Some(101), Some(1)), [Some(100), None, Some(1)], "more cached than prompted");
    assert_eq!(split(Some(100), Some(-1), None), [Some(100), None, None]);
    assert_eq!(split(None, Some(5), Some(1)), [None, None, Some(1)]);
    assert_eq!(split(Some(-5), None, None), [Some(-5), None, None]);
}

#[test]
fn tokens_are_counted_per_model_tenant_and_type_weighted_zero_counts_left_out() {
    let mut acc = accounting(AccountingSettings { tokens: true, ..AccountingSettings::default() }, 100);
    let mut budget = unlimited();
    acc.record(&tokens("m", "team-a", Some(100), Some(30), Some(0)), &mut budget);
    let mut weighted = tokens("m", "team-a", Some(10), None, Some(5));
    weighted.weight = 2.5;
    acc.record(&weighted, &mut budget);
    assert_eq!(samples(&acc, "otel_llm_tenant_tokens"), vec![
        labels("model_name=m,tenant=team-a,token_type=input", 70.0 + 25.0),
        labels("model_name=m,tenant=team-a,token_type=cached_input", 30.0),
        labels("model_name=m,tenant=team-a,token_type=output", 12.5),
    ]);
    // no price table: nothing priced, nothing unpriced
    assert!(samples(&acc, "otel_llm_unpriced_tokens").is_empty() && samples(&acc, "otel_llm_request_cost").is_empty());
}

#[test]
fn a_client_call_is_counted_only_where_no_engine_span_served_it() {
    let mut acc = accounting(AccountingSettings { tokens: true, ..AccountingSettings::default() }, 100);
    let mut budget = unlimited();
    let mut served = tokens("m", "t", Some(1), None, None);
    served.side = Side::Client;
    served.joined_span_id = Some([9; 8]);
    acc.record(&served, &mut budget);
    assert!(acc.snapshot(OVERFLOW).is_empty());
    served.joined_span_id = None;
    acc.record(&served, &mut budget);
    assert_eq!(samples(&acc, "otel_llm_tenant_tokens"), vec![labels("model_name=m,tenant=t,token_type=input", 1.0)]);
    // without a tenant or price table configured, no tokens at all
    let mut off = accounting(AccountingSettings::default(), 100);
    off.record(&tokens("m", "t", Some(1), None, Some(1)), &mut budget);
    assert!(off.snapshot(OVERFLOW).is_empty());
}

#[test]
fn cost_is_priced_per_million_by_type_and_unpriced_types_are_counted_never_priced() {
    let gpt = Price { input: Some(0.15), output: Some(0.60), cached_input: Some(0.075) };
    let no_cache_price = Price { input: Some(2.0), output: None, cached_input: None };
    let mut acc = accounting(priced(&[("gpt", gpt), ("half", no_cache_price)]), 100);
    let mut budget = unlimited();
    acc.record(&tokens("gpt", "t", Some(23), None, Some(7)), &mut budget);
    acc.record(&tokens("half", "t", Some(10), Some(4), Some(3)), &mut budget);
    acc.record(&tokens("free", "t", Some(1), None, None), &mut budget);
    let gpt_cost = 0.0 + 23.0 * 0.15 / 1e6 + 7.0 * 0.60 / 1e6;
    let half_cost = 0.0 + 6.0 * 2.0 / 1e6 + 4.0 * 2.0 / 1e6; // a cached token costs input
    assert_eq!(samples(&acc, "otel_llm_request_cost"), vec![
        labels("currency=USD,model_name=gpt,tenant=t", gpt_cost),
        labels("currency=USD,model_name=half,tenant=t", half_cost),
    ]);
    assert_eq!(gpt_cost, 7.65e-06, "LiteLLM's own figure for this request");
    assert_eq!(samples(&acc, "otel_llm_unpriced_tokens"), vec![
        labels("model_name=half,tenant=t,token_type=output", 3.0),
        labels("model_name=free,tenant=t,token_type=input", 1.0),
    ]);
}

#[test]
fn absurd_prices_cost_what_pythons_order_of_operations_gives() {
    // amount * price / 1e6, in that order: finite where the product is, infinite where it overflows
    // (amount * (price / 1e6) would be finite for both).
    let mut acc = accounting(priced(&[("big", Price { input: Some(1.5e302), ..Price::default() }),
                                      ("huge", Price { input: Some(1e303), ..Price::default() })]), 100);
    let mut budget = unlimited();
    acc.record(&tokens("big", "t", Some(1000), None, None), &mut budget);
    acc.record(&tokens("huge", "t", Some(1_000_000), None, None), &mut budget);
    let costs = samples(&acc, "otel_llm_request_cost");
    assert_eq!(costs[0].1, 1000.0 * 1.5e302 / 1e6);
    assert!(costs[0].1.is_finite());
    assert_eq!(costs[1].1, f64::INFINITY);
    let mut text = String::new();
    acc.render(false, OVERFLOW, &mut text);
    assert!(text.contains("otel_llm_request_cost_total{currency=\"USD\",model_name=\"huge\",tenant=\"t\"} +Inf\n"), "{text}");
    // repr(1000 * 1.5e302 / 1e6) in Python
    assert!(text.contains("model_name=\"big\",tenant=\"t\"} 1.4999999999999999e+299\n"), "{text}");
}

#[test]
fn slo_attainment_counts_server_side_requests_of_models_with_objectives() {
    let mut settings = AccountingSettings {
        default_objectives: Some(objectives(Some(1.0), None, Some(0.99))),
        ..AccountingSettings::default()
    };
    settings.objectives_by_model.insert("big".into(), objectives(Some(5.0), None, Some(0.9)));
    settings.objectives_by_model.insert("target-only".into(), objectives(None, None, Some(0.5)));
    let mut acc = accounting(settings, 100);
    let mut budget = unlimited();
    acc.record(&timed("m", Some(0.5), None), &mut budget);
    acc.record(&timed("m", Some(2.0), None), &mut budget);
    acc.record(&timed("big", Some(2.0), None), &mut budget);
    acc.record(&timed("m", None, None), &mut budget);
    acc.record(&timed("target-only", Some(100.0), None), &mut budget);
    let mut client = timed("m", Some(2.0), None);
    client.side = Side::Client;
    acc.record(&client, &mut budget);
    assert_eq!(samples(&acc, "otel_llm_slo_requests"), vec![
        labels("engine_kind=vllm,model_name=m,slo=met", 1.0),
        labels("engine_kind=vllm,model_name=m,slo=missed", 1.0),
        labels("engine_kind=vllm,model_name=big,slo=met", 1.0),
        labels("engine_kind=vllm,model_name=m,slo=unmeasured", 1.0),
    ]);
    assert_eq!(samples(&acc, "otel_llm_slo_target_ratio"), vec![labels("model_name=big", 0.9), labels("model_name=m", 0.99)]);
    assert!(acc.objectives_of("target-only").is_none());
    assert!(samples(&acc, "otel_llm_tenant_tokens").is_empty(), "tokens are off");
}

#[test]
fn targets_are_bounded_by_the_series_limit() {
    let settings = AccountingSettings {
        default_objectives: Some(objectives(Some(1.0), None, Some(0.9))),
        ..AccountingSettings::default()
    };
    let mut acc = accounting(settings, 2);
    let mut budget = unlimited();
    for model in ["c", "a", "b", "c"] {
        acc.record(&timed(model, Some(0.5), None), &mut budget);
    }
    assert_eq!(samples(&acc, "otel_llm_slo_target_ratio"), vec![labels("model_name=a", 0.9), labels("model_name=c", 0.9)]);
}

#[test]
fn a_label_value_too_long_goes_to_the_overflow_series_counted() {
    let settings = AccountingSettings {
        tokens: true,
        default_objectives: Some(objectives(Some(1.0), None, None)),
        ..AccountingSettings::default()
    };
    let mut acc = Accounting::new(settings, specs(), 100, 16).unwrap();
    let mut budget = unlimited();
    let exactly = "é".repeat(8); // 16 bytes: not over
    let mut long_kind = tokens("m", &exactly, Some(1), None, None);
    long_kind.engine_kind = Cow::Owned("k".repeat(17));
    long_kind.ttft_s = Some(0.1);
    acc.record(&long_kind, &mut budget);
    let mut long_tenant = tokens("m", &"t".repeat(17), Some(2), None, None);
    long_tenant.ttft_s = Some(0.1);
    acc.record(&long_tenant, &mut budget);
    assert_eq!(samples(&acc, "otel_llm_tenant_tokens"), vec![
        labels(&format!("model_name=m,tenant={exactly},token_type=input"), 1.0),
        labels("otel_metric_overflow=true", 2.0),
    ]);
    assert_eq!(samples(&acc, "otel_llm_slo_requests"), vec![labels("otel_metric_overflow=true", 2.0)]);
    assert_eq!(acc.overflowed(), [("otel_llm_tenant_tokens", 1), ("otel_llm_request_cost", 0),
                                  ("otel_llm_unpriced_tokens", 0), ("otel_llm_slo_requests", 2)]);
}

#[test]
fn series_are_capped_with_the_overflow_series_among_them() {
    let settings = AccountingSettings { tokens: true, ..AccountingSettings::default() };
    let mut acc = Accounting::new(settings, specs(), 2, 16).unwrap();
    let mut budget = unlimited();
    acc.record(&tokens("a", "t", Some(1), None, None), &mut budget);
    acc.record(&tokens("x".repeat(20).as_str(), "t", Some(1), None, None), &mut budget); // the overflow series
    acc.record(&tokens("b", "t", Some(1), None, None), &mut budget); // no room: 2 series already
    acc.record(&tokens("a", "t", Some(1), None, None), &mut budget);
    assert_eq!(samples(&acc, "otel_llm_tenant_tokens"), vec![
        labels("model_name=a,tenant=t,token_type=input", 2.0),
        labels("otel_metric_overflow=true", 2.0),
    ]);
    assert_eq!(acc.overflowed()[0], ("otel_llm_tenant_tokens", 2));
    assert_eq!(acc.series(), 2);
}

#[test]
fn a_new_series_takes_its_estimated_bytes_from_the_shared_budget() {
    let settings = AccountingSettings { tokens: true, ..AccountingSettings::default() };
    let mut acc = accounting(settings, 100);
    // len(name) + 54 per line, each label name's length + 4, each value's UTF-8 bytes and escapes
    let first = 22 + 54 + (10 + 4) + (6 + 4) + (10 + 4) + 1 + (3 + 1) + 5; // m, é" (an escape) and input
    let mut budget = SeriesBudget { limit: first as u64 + 10, used: 0 };
    acc.record(&tokens("m", "é\"", Some(1), None, None), &mut budget);
    assert_eq!(budget.used, first as u64);
    acc.record(&tokens("m", "é\"", Some(1), None, None), &mut budget);
    assert_eq!(budget.used, first as u64, "an existing series takes nothing");
    acc.record(&tokens("m", "é\"", None, None, Some(1)), &mut budget); // output: 6 bytes, no room left
    assert_eq!(budget.used, first as u64);
    assert_eq!(samples(&acc, "otel_llm_tenant_tokens"), vec![
        labels("model_name=m,tenant=é\",token_type=input", 2.0),
        labels("otel_metric_overflow=true", 1.0),
    ]);
}

#[test]
fn the_families_render_as_prometheus_client_renders_them() {
    let mut settings = priced(&[("m", Price { input: Some(1.0), output: None, cached_input: None })]);
    settings.default_objectives = Some(objectives(Some(1.0), None, Some(0.95)));
    let mut acc = accounting(settings, 100);
    let mut budget = unlimited();
    let mut request = tokens("m", "a\"b", Some(1_500_000), None, Some(2));
    request.ttft_s = Some(0.5);
    acc.record(&request, &mut budget);
    let mut text = String::new();
    acc.render(false, OVERFLOW, &mut text);
    assert_eq!(text, "\
# HELP otel_llm_tenant_tokens_total otel_llm_tenant_tokens's description
# TYPE otel_llm_tenant_tokens_total counter
otel_llm_tenant_tokens_total{model_name=\"m\",tenant=\"a\\\"b\",token_type=\"input\"} 1.5e+06
otel_llm_tenant_tokens_total{model_name=\"m\",tenant=\"a\\\"b\",token_type=\"output\"} 2.0
# HELP otel_llm_request_cost_total otel_llm_request_cost's description
# TYPE otel_llm_request_cost_total counter
otel_llm_request_cost_total{currency=\"USD\",model_name=\"m\",tenant=\"a\\\"b\"} 1.5
# HELP otel_llm_unpriced_tokens_total otel_llm_unpriced_tokens's description
# TYPE otel_llm_unpriced_tokens_total counter
otel_llm_unpriced_tokens_total{model_name=\"m\",tenant=\"a\\\"b\",token_type=\"output\"} 2.0
# HELP otel_llm_slo_requests_total otel_llm_slo_requests's description
# TYPE otel_llm_slo_requests_total counter
otel_llm_slo_requests_total{engine_kind=\"vllm\",model_name=\"m\",slo=\"met\"} 1.0
# HELP otel_llm_slo_target_ratio otel_llm_slo_target_ratio's description
# TYPE otel_llm_slo_target_ratio gauge
otel_llm_slo_target_ratio{model_name=\"m\"} 0.95
");
    let mut open = String::new();
    acc.render(true, OVERFLOW, &mut open);
    assert!(open.starts_with("# HELP otel_llm_tenant_tokens otel_llm_tenant_tokens's description\n\
                              # TYPE otel_llm_tenant_tokens counter\notel_llm_tenant_tokens_total{"), "{open}");
    assert!(open.ends_with("# TYPE otel_llm_slo_target_ratio gauge\notel_llm_slo_target_ratio{model_name=\"m\"} 0.95\n"));
}

#[test]
fn declarations_that_would_not_expose_as_pythons_are_refused() {
    let mut bad = specs();
    bad.request_cost.name = "otel.llm.cost".into();
    assert!(Accounting::new(AccountingSettings::default(), bad, 10, 256).is_err());
    let mut two = specs();
    two.slo_requests.label_names.pop();
    assert!(Accounting::new(AccountingSettings::default(), two, 10, 256).is_err());
}
