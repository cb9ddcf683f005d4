//! Each policy and the rate limit on their own, with the instant given. Expected decisions follow
//! from the inputs and the policies' definitions (`policies.py`, DESIGN.md's tail sampling section);
//! the `th` texts and thresholds were computed with Python's `threshold_for`/`encode_threshold`.
//! The differential corpus (`tests/decide_corpus.rs`) replays the Python reference's own decisions.

use super::quantiles::upper_edge;
use super::*;
use crate::model::{NewSpan, TraceId, SPAN_KIND_SERVER};
use crate::record::Text;

const NOW: f64 = 1000.0;

fn trace_with(trace_id: TraceId, statuses: &[i32]) -> TraceData {
    let mut data = TraceData::new(trace_id);
    for (index, status) in statuses.iter().enumerate() {
        data.put(&NewSpan {
            span_id: [index as u8 + 1; 8], parent_span_id: None, kind: SPAN_KIND_SERVER, status_code: *status,
            start_unix_ns: 1, end_unix_ns: 2, payload: b"", trace_state: "", resource: b"", scope: b"",
            service_name: "svc", observation: None, attrs_kept: true,
        });
    }
    data
}

fn trace(statuses: &[i32]) -> TraceData {
    trace_with([1; 16], statuses)
}

/// A trace id whose rightmost 56 bits are `randomness`.
fn with_randomness(randomness: u64) -> TraceData {
    let mut id = [0xaa; 16];
    id[9..].copy_from_slice(&randomness.to_be_bytes()[1..]);
    trace_with(id, &[])
}

#[derive(Default, Clone, Copy)]
struct Latencies {
    ttft: Option<f64>,
    tpot: Option<f64>,
    e2e: Option<f64>,
    queue: Option<f64>,
    gateway_overhead: Option<f64>,
}

fn record(model: &str, latencies: Latencies) -> Record<'static> {
    let mut record = Record::new([1; 16], [2; 8]);
    record.model = Text::Owned(model.to_owned());
    record.outcome = Text::Borrowed(outcome::STOP);
    record.ttft_s = latencies.ttft;
    record.tpot_s = latencies.tpot;
    record.e2e_s = latencies.e2e;
    record.queue_s = latencies.queue;
    record.gateway_overhead_s = latencies.gateway_overhead;
    record
}

fn ttft(model: &str, value: f64) -> Record<'static> {
    record(model, Latencies { ttft: Some(value), ..Latencies::default() })
}

fn with_outcome(mut record: Record<'static>, outcome: &'static str) -> Record<'static> {
    record.outcome = Text::Borrowed(outcome);
    record
}

fn client(mut record: Record<'static>) -> Record<'static> {
    record.side = Side::Client;
    record
}

fn policy(name: &str, rule: Rule) -> PolicyConfig {
    PolicyConfig { name: name.into(), rule }
}

fn config(policies: Vec<PolicyConfig>) -> SamplerConfig {
    SamplerConfig { policies, traces_per_second: 0.0, per_model_traces_per_second: 0.0, applies_to: Vec::new(),
                    max_models: MAX_MODELS }
}

fn slowest(metrics: &[PolicyMetric], quantile: f64, window_s: f64) -> Rule {
    Rule::Slowest { metrics: metrics.to_vec(), quantile, window_s }
}

fn slo(thresholds: &[(PolicyMetric, f64)], per_model: &[(&str, &[(PolicyMetric, f64)])]) -> Rule {
    Rule::Slo {
        thresholds: thresholds.to_vec(),
        per_model: per_model.iter().map(|(m, limits)| (m.to_string(), limits.to_vec())).collect(),
    }
}

/// A sampler of one policy and whether it matched (kept) each time.
struct One {
    sampler: Sampler,
    names: Names,
}

impl One {
    fn new(rule: Rule) -> One {
        One::with(config(vec![policy("p", rule)]))
    }

    fn with(config: SamplerConfig) -> One {
        let mut names = Names::default();
        let sampler = Sampler::new(&config, &mut names, NOW).unwrap();
        One { sampler, names }
    }

    fn keeps(&mut self, trace: &TraceData, records: &[Record<'_>]) -> bool {
        self.keeps_at(trace, records, NOW)
    }

    fn keeps_at(&mut self, trace: &TraceData, records: &[Record<'_>], now: f64) -> bool {
        self.sampler.decide(trace, records, now).unwrap().keep
    }

    fn decide(&mut self, records: &[Record<'_>], now: f64) -> (bool, bool, String, String) {
        let decision = self.sampler.decide(&trace(&[]), records, now).unwrap();
        (decision.keep, decision.rate_limited, self.names.name(decision.policy).to_owned(),
         self.names.name(decision.threshold).to_owned())
    }
}

// --- errors ------------------------------------------------------------------------------------------

#[test]
fn errors_keeps_failed_requests_and_error_spans_only() {
    let mut one = One::new(Rule::Errors);
    for failed in [outcome::ERROR, outcome::ABORT] {
        assert!(one.keeps(&trace(&[0]), &[ttft("m", 0.1), with_outcome(ttft("m", 0.1), failed)]));
        // a failed client-side request counts too (the policy does not look at the side)
        assert!(one.keeps(&trace(&[]), &[client(with_outcome(ttft("m", 0.1), failed))]));
    }
    assert!(one.keeps(&trace(&[0, 1, STATUS_CODE_ERROR]), &[]));
    for healthy in [outcome::STOP, outcome::LENGTH, outcome::UNKNOWN, "", "ERROR"] {
        assert!(!one.keeps(&trace(&[0, 1]), &[with_outcome(ttft("m", 0.1), healthy)]), "{healthy}");
    }
    assert!(!one.keeps(&trace(&[]), &[]));
    assert!(!one.keeps(&trace(&[3, -2]), &[]));
}

// --- slo --------------------------------------------------------------------------------------------

#[test]
fn slo_checks_every_metric_strictly_above_its_limit() {
    for metric in PolicyMetric::ALL {
        let mut one = One::new(slo(&[(metric, 2.0)], &[]));
        let at = |value: f64| {
            let mut latencies = Latencies::default();
            match metric {
                PolicyMetric::Ttft => latencies.ttft = Some(value),
                PolicyMetric::Tpot => latencies.tpot = Some(value),
                PolicyMetric::E2e => latencies.e2e = Some(value),
                PolicyMetric::Queue => latencies.queue = Some(value),
                PolicyMetric::GatewayOverhead => latencies.gateway_overhead = Some(value),
            }
            record("m", latencies)
        };
        assert!(one.keeps(&trace(&[]), &[at(2.5)]), "{metric:?}");
        assert!(!one.keeps(&trace(&[]), &[at(2.0)]), "{metric:?}: equal to the limit is within it");
        assert!(one.keeps(&trace(&[]), &[at(f64::from_bits(2.0f64.to_bits() + 1))]));
        assert!(!one.keeps(&trace(&[]), &[at(f64::NAN)]), "NaN is above nothing");
        assert!(one.keeps(&trace(&[]), &[at(f64::INFINITY)]));
        assert!(!one.keeps(&trace(&[]), &[record("m", Latencies::default())]));
        assert_eq!(PolicyMetric::parse(metric.name()), Some(metric));
    }
    assert_eq!(PolicyMetric::parse("ttft_s"), None);
}

#[test]
fn slo_ignores_client_records_and_checks_every_record() {
    let mut one = One::new(slo(&[(PolicyMetric::Ttft, 1.0)], &[]));
    assert!(!one.keeps(&trace(&[]), &[client(ttft("m", 5.0))]));
    assert!(one.keeps(&trace(&[]), &[ttft("m", 0.5), client(ttft("m", 5.0)), ttft("m", 1.5)]));
    // a failed request is judged on its values too (the errors policy is the one for failures)
    assert!(one.keeps(&trace(&[]), &[with_outcome(ttft("m", 1.5), outcome::ABORT)]));
}

#[test]
fn slo_per_model_overrides_keep_the_other_defaults() {
    let e2e = |model: &str, value: f64| record(model, Latencies { e2e: Some(value), ..Latencies::default() });
    let mut one = One::new(slo(&[(PolicyMetric::Ttft, 1.0), (PolicyMetric::E2e, 10.0)],
                               &[("big", &[(PolicyMetric::Ttft, 5.0)]), ("tiny", &[(PolicyMetric::Queue, 0.1)])]));
    assert!(!one.keeps(&trace(&[]), &[ttft("big", 3.0)]));
    assert!(one.keeps(&trace(&[]), &[ttft("big", 6.0)]));
    assert!(one.keeps(&trace(&[]), &[e2e("big", 11.0)]), "big keeps the default e2e limit");
    assert!(one.keeps(&trace(&[]), &[ttft("small", 3.0)]), "a model without overrides has the defaults");
    assert!(one.keeps(&trace(&[]), &[record("tiny", Latencies { queue: Some(0.2), ..Latencies::default() })]));
    assert!(!one.keeps(&trace(&[]), &[record("m", Latencies { queue: Some(0.2), ..Latencies::default() })]));
    // a model with limits of its own only (no defaults)
    let mut only = One::new(slo(&[], &[("big", &[(PolicyMetric::Ttft, 5.0)])]));
    assert!(!only.keeps(&trace(&[]), &[ttft("m", 100.0)]));
    assert!(only.keeps(&trace(&[]), &[ttft("big", 6.0)]));
}

// --- slowest ------------------------------------------------------------------------------------------

#[test]
fn slowest_keeps_each_models_slow_tail_against_its_own_traffic() {
    let mut one = One::new(slowest(&[PolicyMetric::Ttft], 0.9, 600.0));
    for i in 0..300 {
        one.keeps(&trace(&[]), &[ttft("fast", 0.1 + f64::from(i % 10) * 0.001)]);
        one.keeps(&trace(&[]), &[ttft("slow", 1.0 + f64::from(i % 10) * 0.01)]);
    }
    assert!(one.keeps(&trace(&[]), &[ttft("fast", 0.3)]), "3x fast's usual, far below slow's");
    assert!(!one.keeps(&trace(&[]), &[ttft("slow", 0.9)]));
}

#[test]
fn slowest_keeps_a_models_first_request_and_new_extremes_and_not_a_value_equal_to_its_threshold() {
    let mut one = One::new(slowest(&[PolicyMetric::Ttft], 0.99, 600.0));
    assert!(one.keeps(&trace(&[]), &[ttft("m", 0.2)]), "nothing seen before");
    for _ in 0..100 {
        one.keeps(&trace(&[]), &[ttft("m", 0.2)]);
    }
    assert!(!one.keeps(&trace(&[]), &[ttft("m", 0.2)]));
    // The threshold is the upper edge of 0.2's bin: a value at it is not above it, one past it is.
    let edge = (1..200).map(upper_edge).find(|edge| *edge > 0.2).unwrap();
    assert!(!one.keeps(&trace(&[]), &[ttft("m", edge)]));
    assert!(one.keeps(&trace(&[]), &[ttft("m", 0.5)]));
}

#[test]
fn slowest_skips_failed_client_and_valueless_records() {
    let mut one = One::new(slowest(&[PolicyMetric::Ttft], 0.5, 600.0));
    assert!(!one.keeps(&trace(&[]), &[with_outcome(ttft("m", 1.0), outcome::ABORT)]));
    assert!(!one.keeps(&trace(&[]), &[with_outcome(ttft("m", 1.0), outcome::ERROR)]));
    assert!(!one.keeps(&trace(&[]), &[client(ttft("m", 1.0))]));
    assert!(!one.keeps(&trace(&[]), &[record("m", Latencies::default())]));
    assert!(!one.keeps(&trace(&[]), &[]));
    assert_eq!(one.sampler.held().0, 0, "no window made for what is skipped");
    assert!(one.keeps(&trace(&[]), &[ttft("m", 1.0)]), "still the first value it learns from");
}

#[test]
fn slowest_learns_every_metric_of_every_record() {
    let both = |ttft: f64, e2e: f64| record("m", Latencies { ttft: Some(ttft), e2e: Some(e2e), ..Latencies::default() });
    let mut one = One::new(slowest(&[PolicyMetric::Ttft, PolicyMetric::E2e], 0.5, 600.0));
    for _ in 0..50 {
        one.keeps(&trace(&[]), &[both(0.1, 1.0), both(0.1, 1.0)]);
    }
    assert!(!one.keeps(&trace(&[]), &[both(0.1, 1.0)]));
    assert!(one.keeps(&trace(&[]), &[both(0.1, 3.0)]), "e2e alone is slow");
    assert!(one.keeps(&trace(&[]), &[both(0.1, 1.0), both(0.5, 1.0)]), "the second record is slow");
}

#[test]
fn slowest_models_past_max_models_share_one_window_per_metric() {
    let both = |model: &str, ttft: f64, e2e: f64| {
        record(model, Latencies { ttft: Some(ttft), e2e: Some(e2e), ..Latencies::default() })
    };
    let mut cfg = config(vec![policy("p", slowest(&[PolicyMetric::Ttft, PolicyMetric::E2e], 0.5, 600.0))]);
    cfg.max_models = 1;
    let mut one = One::with(cfg);
    for _ in 0..50 {
        one.keeps(&trace(&[]), &[both("a", 0.1, 0.1)]);
    }
    for _ in 0..50 {
        one.keeps(&trace(&[]), &[both("b", 1.0, 1.0)]);
    }
    assert!(one.keeps(&trace(&[]), &[both("a", 0.5, 0.05)]), "a keeps its own ttft window");
    assert!(one.keeps(&trace(&[]), &[both("a", 0.05, 0.5)]), "... and its own e2e window");
    assert!(!one.keeps(&trace(&[]), &[both("c", 0.5, 0.5)]), "c is judged against the window b filled");
    for index in 0..500 {
        one.keeps(&trace(&[]), &[both(&format!("flood-{index}"), 0.5, 0.5)]);
    }
    assert_eq!(one.sampler.held().0, 4, "a's two windows and the shared two, whatever the names");
}

#[test]
fn slowest_a_model_whose_first_metric_got_a_window_may_share_for_the_next() {
    // Windows are made when a value comes: at max_models=1, "a" takes the ttft window, then "b"'s
    // e2e value takes the second (the cap is max_models * metrics windows); a's e2e then shares.
    let mut cfg = config(vec![policy("p", slowest(&[PolicyMetric::Ttft, PolicyMetric::E2e], 0.5, 600.0))]);
    cfg.max_models = 1;
    let mut one = One::with(cfg);
    let e2e = |model: &str, value: f64| record(model, Latencies { e2e: Some(value), ..Latencies::default() });
    assert!(one.keeps(&trace(&[]), &[ttft("a", 0.1)]));
    assert!(one.keeps(&trace(&[]), &[e2e("b", 5.0)]));
    assert!(one.keeps(&trace(&[]), &[e2e("a", 1.0)]), "the shared e2e window's first value");
    assert!(!one.keeps(&trace(&[]), &[e2e("c", 1.0)]), "c shares it with a");
    assert!(!one.keeps(&trace(&[]), &[e2e("b", 4.0)]), "b kept its own, holding 5.0");
    assert_eq!(one.sampler.held().0, 3);
}

#[test]
fn slowest_window_forgets_old_traffic() {
    let mut one = One::new(slowest(&[PolicyMetric::Ttft], 0.5, 60.0));
    for _ in 0..50 {
        one.keeps_at(&trace(&[]), &[ttft("m", 5.0)], NOW);
    }
    assert!(!one.keeps_at(&trace(&[]), &[ttft("m", 1.0)], NOW));
    assert!(one.keeps_at(&trace(&[]), &[ttft("m", 1.0)], NOW + 200.0), "the window has passed");
}

#[test]
fn slowest_a_latency_python_cannot_bin_fails_the_trace_with_its_error_and_what_ran_stays_done() {
    let cfg = config(vec![
        policy("errors", Rule::Errors),
        policy("slow", slowest(&[PolicyMetric::Ttft, PolicyMetric::E2e], 0.5, 600.0)),
        policy("later", slowest(&[PolicyMetric::Ttft], 0.5, 600.0)),
    ]);
    let mut one = One::with(cfg);
    let bad = |e2e: f64| record("m", Latencies { ttft: Some(0.1), e2e: Some(e2e), ..Latencies::default() });
    for (value, python) in [(f64::NAN, "ValueError"), (f64::INFINITY, "OverflowError"), (1e305, "OverflowError")] {
        let error = one.sampler.decide(&trace(&[STATUS_CODE_ERROR]), &[bad(value)], NOW).unwrap_err();
        let DecideError::Window { policy, cause } = error;
        assert_eq!(one.names.name(policy), "slow");
        assert_eq!(cause.python_exception(), python);
        assert!(error.python_fails());
    }
    assert_eq!(one.sampler.decide(&trace(&[]), &[bad(f64::NAN)], NOW).unwrap_err().to_string(),
               "cannot convert float NaN to integer");
    // The ttft value before each failing e2e was learnt by "slow"; "later", after the failing
    // policy, never saw those traces: its window is made now, and 0.1 is its first value.
    assert_eq!(one.sampler.held().0, 2, "slow's ttft and e2e windows; none for 'later'");
    let (keep, _, policy, _) = one.decide(&[ttft("m", 0.1)], NOW);
    assert!(keep);
    assert_eq!(policy, "later", "0.1 is not slow against slow's four 0.1s, and later's first");
    assert_eq!(one.sampler.held().0, 3);
    // A latency below the first bin (negative, -inf) is binned, not an error.
    assert!(one.sampler.decide(&trace(&[]), &[bad(f64::NEG_INFINITY)], NOW).is_ok());
    // A clock Python's int() refuses is its ValueError too; one past 2^63 slices is declined.
    let error = one.sampler.decide(&trace(&[]), &[ttft("m", 0.1)], f64::NAN).unwrap_err();
    assert!(error.python_fails());
    let error = one.sampler.decide(&trace(&[]), &[ttft("m", 0.1)], 1e300).unwrap_err();
    assert!(!error.python_fails());
}

// --- probabilistic -------------------------------------------------------------------------------------

#[test]
fn probabilistic_threshold_is_inclusive_on_the_rightmost_56_bits() {
    let mut one = One::new(Rule::Probabilistic { sampling_percentage: 25.0 });
    let threshold = 3u64 << 54; // (1 - 0.25) * 2^56
    assert!(one.keeps(&with_randomness(threshold), &[]));
    assert!(!one.keeps(&with_randomness(threshold - 1), &[]));
    assert!(one.keeps(&with_randomness((1 << 56) - 1), &[]));
    let mut id = [0xff; 16];
    id[9..].fill(0);
    assert_eq!(randomness_of(&id), 0, "the first nine bytes are not read");
    let id: [u8; 16] = std::array::from_fn(|i| i as u8);
    assert_eq!(randomness_of(&id), 0x090a0b0c0d0e0f);
}

#[test]
fn probabilistic_thresholds_encode_as_otel_th() {
    // (percentage, th) as Python's encode_threshold(threshold_for(percentage / 100)) gives them
    for (percentage, th) in [(100.0, "0"), (50.0, "8"), (25.0, "c"), (12.5, "e"), (1.0, "fd70a3d70a3d7"),
                             (0.1, "ffbe76c8b43958"), (100.0 / 3.0, "aaaaaaaaaaaaa8")] {
        let mut one = One::new(Rule::Probabilistic { sampling_percentage: percentage });
        // an all-ones randomness is kept at any rate above 0
        let decision = one.sampler.decide(&with_randomness((1 << 56) - 1), &[], NOW).unwrap();
        assert_eq!(one.names.name(decision.threshold), th, "{percentage}");
    }
    assert_eq!(threshold_for(0.01), Ok(71337018097548656));
    assert_eq!(threshold_for(0.0), Ok(1 << 56));
    assert_eq!(encode_threshold(1 << 56), "1", "keep none: 2^56, fifteen digits");
    assert_eq!(encode_threshold(0), "0");
}

#[test]
fn probabilistic_at_zero_keeps_nothing_and_at_a_hundred_everything() {
    let mut all = One::new(Rule::Probabilistic { sampling_percentage: 100.0 });
    let mut none = One::new(Rule::Probabilistic { sampling_percentage: 0.0 });
    for randomness in [0, 1, 1 << 55, (1 << 56) - 1] {
        assert!(all.keeps(&with_randomness(randomness), &[]));
        assert!(!none.keeps(&with_randomness(randomness), &[]));
    }
    assert!(!none.keeps(&trace_with([0xff; 16], &[]), &[]));
    assert!(all.keeps(&trace_with([0; 16], &[]), &[]));
}

#[test]
fn probabilistic_rates_python_cannot_round_or_the_configuration_refuses_are_refused() {
    for percentage in [f64::NAN, f64::INFINITY, -1.0, 100.5] {
        let cfg = config(vec![policy("p", Rule::Probabilistic { sampling_percentage: percentage })]);
        assert!(Sampler::new(&cfg, &mut Names::default(), NOW).is_err(), "{percentage}");
    }
}

// --- the sampler -------------------------------------------------------------------------------------

#[test]
fn the_first_match_decides_and_every_policy_still_sees_every_trace() {
    let cfg = config(vec![
        policy("errors", Rule::Errors),
        policy("slowest", slowest(&[PolicyMetric::Ttft], 0.5, 600.0)),
        policy("all", Rule::Probabilistic { sampling_percentage: 100.0 }),
    ]);
    let mut one = One::with(cfg);
    assert_eq!(one.decide(&[with_outcome(ttft("m", 1.0), outcome::ERROR)], NOW),
               (true, false, "errors".into(), "0".into()));
    // A failed request is not learnt by the slowest policy; a healthy one in an errored trace is.
    let decision = one.sampler.decide(&trace(&[STATUS_CODE_ERROR]), &[ttft("m", 5.0)], NOW).unwrap();
    assert_eq!(one.names.name(decision.policy), "errors");
    for _ in 0..3 {
        assert_eq!(one.decide(&[ttft("m", 1.0)], NOW).2, "all", "5.0 is in the window: 1.0 is not slow");
    }
    assert_eq!(one.decide(&[ttft("m", 9.0)], NOW), (true, false, "slowest".into(), "0".into()));
    assert_eq!(one.decide(&[ttft("m", 0.5)], NOW), (true, false, "all".into(), "0".into()));
    let mut none = One::with(config(vec![policy("errors", Rule::Errors)]));
    assert_eq!(none.sampler.decide(&trace(&[]), &[ttft("m", 1.0)], NOW), Ok(DROP));
    assert_eq!(One::with(config(vec![])).sampler.decide(&trace(&[]), &[], NOW), Ok(DROP));
}

#[test]
fn names_are_interned_in_the_engines_names_and_refused_when_it_is_full() {
    let mut names = Names::default();
    let before = names.intern("journaled-policy");
    let sampler = Sampler::new(&SamplerConfig::with_default_policies(), &mut names, NOW).unwrap();
    drop(sampler);
    assert_eq!(names.name(before), "journaled-policy");
    for name in ["errors", "slowest", "baseline", "0", "fd70a3d70a3d7"] {
        assert!(names.get(name).is_some(), "{name}");
    }
    let mut full = Names::default();
    for index in 0..u16::MAX {
        full.intern(&index.to_string());
    }
    let cfg = config(vec![policy("a-new-name", Rule::Errors)]);
    assert!(Sampler::new(&cfg, &mut full, NOW).unwrap_err().contains("a-new-name"));
}

// --- the rate limit ---------------------------------------------------------------------------------

fn limited(per_second: f64, per_model: f64, applies_to: &[&str], max_models: usize) -> One {
    let mut cfg = config(vec![
        policy("errors", Rule::Errors),
        policy("slo", slo(&[(PolicyMetric::Ttft, 0.0)], &[])),
        policy("all", Rule::Probabilistic { sampling_percentage: 100.0 }),
    ]);
    cfg.traces_per_second = per_second;
    cfg.per_model_traces_per_second = per_model;
    cfg.applies_to = applies_to.iter().map(|n| n.to_string()).collect();
    cfg.max_models = max_models;
    One::with(cfg)
}

/// Whether a trace the `slo` policy keeps (a model's request with a TTFT) passes the limit at `now`.
fn slo_passes(one: &mut One, model: &str, now: f64) -> bool {
    let (keep, rate_limited, policy, threshold) = one.decide(&[ttft(model, 1.0)], now);
    assert_eq!(policy, "slo");
    assert_eq!(rate_limited, !keep);
    assert_eq!(threshold, if keep { "0" } else { "" }, "a rate-limited decision has no threshold");
    keep
}

#[test]
fn a_token_bucket_bursts_its_capacity_then_refills_over_time() {
    let mut bucket = TokenBucket::new(2.0, NOW);
    assert_eq!([bucket.take(NOW), bucket.take(NOW), bucket.take(NOW)], [true, true, false]);
    assert!(!bucket.take(NOW + 0.25), "half a token");
    assert!(bucket.take(NOW + 0.5), "one token in all");
    assert!(!bucket.take(NOW + 0.5));
    let later = NOW + 100.5; // idle: refilled to its capacity, not beyond
    assert_eq!([bucket.take(later), bucket.take(later), bucket.take(later)], [true, true, false]);
    assert!(!bucket.take(later), "a clock going nowhere adds nothing");
}

#[test]
fn a_token_bucket_at_one_per_second_and_below() {
    let mut bucket = TokenBucket::new(1.0, NOW);
    assert!(bucket.take(NOW));
    assert!(!bucket.take(NOW));
    assert!(!bucket.take(NOW + 0.5));
    assert!(bucket.take(NOW + 1.0), "exactly one token again");
    assert!(!bucket.take(NOW + 1.0));
    // 0.2/s: one trace every 5 s, and a bucket of one token, not 0.2
    let mut slow = TokenBucket::new(0.2, NOW);
    assert!(slow.take(NOW));
    assert!(!slow.take(NOW + 4.0));
    assert!(slow.take(NOW + 5.0));
    assert_eq!([slow.take(NOW + 65.0), slow.take(NOW + 65.0)], [true, false], "a long idle gives a burst of one");
    // the clock going back takes tokens away (Python's arithmetic, unguarded) until it comes back
    let mut back = TokenBucket::new(1.0, NOW);
    assert!(!back.take(NOW - 0.5));
    assert!(back.take(NOW));
}

#[test]
fn errors_are_exempt_from_the_rate_limit_by_default() {
    let mut one = limited(1.0, 0.0, &[], MAX_MODELS);
    assert!(slo_passes(&mut one, "a", NOW));
    assert!(!slo_passes(&mut one, "a", NOW));
    for _ in 0..5 {
        let decision = one.decide(&[with_outcome(ttft("a", 1.0), outcome::ERROR)], NOW);
        assert_eq!(decision, (true, false, "errors".into(), "0".into()));
    }
    // a policy applies_to names is limited; one it does not name is not
    let mut named = limited(1.0, 0.0, &["errors"], MAX_MODELS);
    assert!(named.decide(&[with_outcome(ttft("a", 1.0), outcome::ERROR)], NOW).0);
    assert_eq!(named.decide(&[with_outcome(ttft("a", 1.0), outcome::ERROR)], NOW),
               (false, true, "errors".into(), "".into()));
    assert!(slo_passes(&mut named, "a", NOW) && slo_passes(&mut named, "a", NOW));
}

#[test]
fn the_overall_limit_refills_and_starts_full_at_construction() {
    let mut one = limited(2.0, 0.0, &[], MAX_MODELS);
    // constructed at NOW, full: two at once, even a second later (capped at its capacity)
    let at = NOW + 1.0;
    assert_eq!([slo_passes(&mut one, "m0", at), slo_passes(&mut one, "m1", at), slo_passes(&mut one, "m2", at)],
               [true, true, false]);
    assert!(slo_passes(&mut one, "other", at + 0.5));
    assert!(!slo_passes(&mut one, "other", at + 0.5));
    let mut one_per_second = limited(1.0, 0.0, &[], MAX_MODELS);
    assert!(slo_passes(&mut one_per_second, "a", NOW));
    assert!(!slo_passes(&mut one_per_second, "b", NOW));
    assert!(slo_passes(&mut one_per_second, "c", NOW + 1.0));
}

#[test]
fn a_per_model_limit_alone_does_not_block_other_models() {
    let mut one = limited(0.0, 1.0, &[], MAX_MODELS);
    assert!(slo_passes(&mut one, "a", NOW));
    assert!(!slo_passes(&mut one, "a", NOW), "a's own budget is spent");
    assert!(slo_passes(&mut one, "b", NOW), "b has its own");
    assert!(slo_passes(&mut one, "a", NOW + 1.0));
    // A trace without records is one model ("__none__"): the probabilistic policy keeps it.
    assert_eq!(one.decide(&[], NOW), (true, false, "all".into(), "0".into()));
    assert_eq!(one.decide(&[], NOW), (false, true, "all".into(), "".into()));
}

#[test]
fn a_per_model_limit_reads_the_first_record_and_spares_the_overall_budget() {
    let mut one = limited(2.0, 1.0, &[], MAX_MODELS);
    assert!(slo_passes(&mut one, "a", NOW));
    assert!(!slo_passes(&mut one, "a", NOW), "per model; the overall budget untouched");
    assert!(slo_passes(&mut one, "b", NOW));
    assert!(!slo_passes(&mut one, "c", NOW), "the overall budget is spent");
    let mut first = limited(0.0, 1.0, &[], MAX_MODELS);
    assert!(first.decide(&[ttft("a", 1.0), ttft("b", 1.0)], NOW).0);
    assert!(first.decide(&[ttft("b", 1.0)], NOW).0);
    assert!(!first.decide(&[ttft("a", 1.0), ttft("c", 1.0)], NOW).0);
}

#[test]
fn per_model_buckets_are_bounded_and_models_past_the_bound_share_one() {
    let mut one = limited(0.0, 1.0, &[], 1);
    assert!(slo_passes(&mut one, "a", NOW), "a has its own bucket");
    assert!(slo_passes(&mut one, "b", NOW), "past the bound: b and c share one");
    assert!(!slo_passes(&mut one, "c", NOW));
    assert!(!slo_passes(&mut one, "a", NOW));
    for index in 0..100 {
        slo_passes(&mut one, &format!("flood-{index}"), NOW);
    }
    assert_eq!(one.sampler.held().1, 2);
    let mut default = limited(0.0, 1.0, &[], MAX_MODELS);
    assert!((0..1000).all(|i| slo_passes(&mut default, &format!("m{i}"), NOW)));
    assert!(slo_passes(&mut default, "m1000", NOW), "the shared bucket's one token");
    assert!(!slo_passes(&mut default, "m1001", NOW));
}

#[test]
fn per_model_limits_below_one_per_second_start_with_one_token() {
    let mut one = limited(0.0, 0.5, &[], MAX_MODELS);
    assert!(slo_passes(&mut one, "a", NOW));
    assert!(!slo_passes(&mut one, "a", NOW));
    assert!(!slo_passes(&mut one, "a", NOW + 1.9));
    assert!(slo_passes(&mut one, "a", NOW + 3.9), "0.95 tokens at +1.9 s, 1.95 capped at one at +3.9 s");
}

#[test]
fn no_limits_allow_everything_and_negative_rates_are_refused() {
    let mut one = limited(0.0, 0.0, &[], MAX_MODELS);
    assert!((0..10).all(|_| slo_passes(&mut one, "a", NOW)));
    let mut cfg = config(vec![]);
    cfg.traces_per_second = -1.0;
    assert!(Sampler::new(&cfg, &mut Names::default(), NOW).is_err());
    cfg.traces_per_second = f64::NAN;
    assert!(Sampler::new(&cfg, &mut Names::default(), NOW).is_err());
}

#[test]
fn a_window_that_is_not_a_positive_duration_is_refused() {
    for window_s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let cfg = config(vec![policy("p", slowest(&[PolicyMetric::Ttft], 0.5, window_s))]);
        assert!(Sampler::new(&cfg, &mut Names::default(), NOW).is_err(), "{window_s}");
    }
}
