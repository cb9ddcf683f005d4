//! The tail sampler: `processor/tail_sampling/sampler.py` `TailSampler` and the policies of
//! `policies.py`, on the engine's own traces and records. Every policy sees every trace (the
//! rolling quantiles learn from all traffic), the first that matches in configuration order is the
//! decision, then the rate limit may turn a keep into a rate-limited drop.
//!
//! Names: the sampler interns its policies' names and thresholds in the `Names` it is given at
//! construction (the engine's, shared with the decision cache and the journal); a `Decision`
//! holds their ids, and `Names::name` gives the texts back.
//!
//! Time: `now` (seconds of a monotonic clock) is the caller's, read once per tick; Python reads
//! `time.monotonic()` per trace in the slowest policy and per token bucket, which within one batch
//! is the same instant up to the batch's own duration.
//!
//! A decision that fails: Python's `decide_batch` hands a trace whose policies raised its
//! exception in place of a decision. The only raising path is the slowest policy's window when a
//! latency is NaN (`ValueError`) or infinite or so large that its bin overflows (`OverflowError`),
//! or the clock is NaN or infinite: `decide` returns `Err(DecideError)` for that trace, having
//! changed exactly what Python's policies had changed when they raised (the policies before it
//! ran, the windows updated up to the value that raised; the policies after it and the rate limit
//! never ran). One failure is this port's own: a clock past 2^63 of the window's slices (Python's
//! integers go on), declined (`DecideError::python_fails` is false), unreachable for a monotonic
//! clock (29 million years at the shortest window). The rest of `policies.py` raises only on what
//! the configuration refuses (an unknown metric, a window of 0, a rate Python cannot round), which
//! `Sampler::new` refuses.

use std::collections::HashMap;
use std::fmt;

use crate::model::{Decision, NameId, Names, TraceData, DROP, STATUS_CODE_ERROR};
use crate::record::{outcome, Record, Side};

pub mod quantiles;

use quantiles::{RollingQuantile, Slice, Unbinnable, SLICES};

/// `policies.SlowestPolicy`'s and `RateLimit`'s `max_models` default (neither is configurable).
pub const MAX_MODELS: usize = 1000;
/// `policies._OTHER_MODEL`: the window (and bucket) every model past `max_models` shares.
pub const OTHER_MODEL: &str = "__other__";
/// `RateLimit.allow`'s model of a trace without records.
pub const NO_MODEL: &str = "__none__";
/// `ProbabilisticPolicy`: the rightmost 56 bits of a trace id are random (W3C trace-context level 2).
const MAX_THRESHOLD: u64 = 1 << 56;

/// `policies.METRIC_ATTRIBUTES`: a policy metric and the record field it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyMetric {
    Ttft,
    Tpot,
    E2e,
    Queue,
    GatewayOverhead,
}

impl PolicyMetric {
    pub const ALL: [PolicyMetric; 5] =
        [PolicyMetric::Ttft, PolicyMetric::Tpot, PolicyMetric::E2e, PolicyMetric::Queue, PolicyMetric::GatewayOverhead];

    /// The metric by its configuration name (`ttft`, `tpot`, `e2e`, `queue`, `gateway_overhead`).
    pub fn parse(name: &str) -> Option<PolicyMetric> {
        PolicyMetric::ALL.into_iter().find(|metric| metric.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            PolicyMetric::Ttft => "ttft",
            PolicyMetric::Tpot => "tpot",
            PolicyMetric::E2e => "e2e",
            PolicyMetric::Queue => "queue",
            PolicyMetric::GatewayOverhead => "gateway_overhead",
        }
    }

    /// `policies.METRICS[metric](record)`.
    pub fn read(self, record: &Record<'_>) -> Option<f64> {
        match self {
            PolicyMetric::Ttft => record.ttft_s,
            PolicyMetric::Tpot => record.tpot_s,
            PolicyMetric::E2e => record.e2e_s,
            PolicyMetric::Queue => record.queue_s,
            PolicyMetric::GatewayOverhead => record.gateway_overhead_s,
        }
    }
}

// --- configuration ------------------------------------------------------------------------------

/// `config.PolicyConfig` (its `type` and block): what `sampler.build_policies` builds a policy of.
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    /// `ErrorsPolicy`.
    Errors,
    /// `SloPolicy`: static thresholds, `per_model` overriding them for a model (the others kept).
    Slo { thresholds: Vec<(PolicyMetric, f64)>, per_model: Vec<(String, Vec<(PolicyMetric, f64)>)> },
    /// `SlowestPolicy(metrics, quantile, window)`.
    Slowest { metrics: Vec<PolicyMetric>, quantile: f64, window_s: f64 },
    /// `ProbabilisticPolicy(sampling_percentage / 100.0)`.
    Probabilistic { sampling_percentage: f64 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    pub name: String,
    pub rule: Rule,
}

/// `config.TailSamplingProcessor`'s `policies` and `rate_limit`, as the sampler reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    pub policies: Vec<PolicyConfig>,
    /// `rate_limit.traces_per_second` (0: no overall limit).
    pub traces_per_second: f64,
    /// `rate_limit.per_model_traces_per_second` (0: no per-model limit).
    pub per_model_traces_per_second: f64,
    /// `rate_limit.applies_to`: policy names; empty = every policy but the errors ones.
    pub applies_to: Vec<String>,
    /// The slowest policies' and the rate limit's `max_models` (Python: their default, `MAX_MODELS`).
    pub max_models: usize,
}

impl SamplerConfig {
    /// `config.default_policies()`: every error and abort, every request above its model's rolling
    /// p99 of TTFT or e2e over 10 minutes, a 1 % baseline; no rate limit.
    pub fn with_default_policies() -> SamplerConfig {
        SamplerConfig {
            policies: vec![
                PolicyConfig { name: "errors".into(), rule: Rule::Errors },
                PolicyConfig {
                    name: "slowest".into(),
                    rule: Rule::Slowest { metrics: vec![PolicyMetric::Ttft, PolicyMetric::E2e], quantile: 0.99,
                                          window_s: 600.0 },
                },
                PolicyConfig { name: "baseline".into(), rule: Rule::Probabilistic { sampling_percentage: 1.0 } },
            ],
            traces_per_second: 0.0,
            per_model_traces_per_second: 0.0,
            applies_to: Vec::new(),
            max_models: MAX_MODELS,
        }
    }
}

// --- errors ----------------------------------------------------------------------------------------

/// Why one trace has no decision (Python: the exception `decide_batch` returns in its place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecideError {
    /// A slowest policy's window could not bin a latency or slice the clock (see `Unbinnable`:
    /// `python_exception()` names what Python raised, "" where it would not have).
    Window { policy: NameId, cause: Unbinnable },
}

impl DecideError {
    /// Whether Python fails this trace too (else this port declined what it cannot hold).
    pub fn python_fails(&self) -> bool {
        match self {
            DecideError::Window { cause, .. } => !cause.python_exception().is_empty(),
        }
    }
}

impl fmt::Display for DecideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecideError::Window { cause, .. } => cause.fmt(f),
        }
    }
}

impl std::error::Error for DecideError {}

// --- the policies ----------------------------------------------------------------------------------

/// `SloPolicy`: per model, its limits merged once (`{**thresholds, **per_model[model]}`).
#[derive(Debug)]
struct Slo {
    defaults: Vec<(PolicyMetric, f64)>,
    per_model: HashMap<String, Vec<(PolicyMetric, f64)>>,
}

/// `{**a, **b}` of two metric -> limit lists: `b`'s value wins, every key once (the last of
/// repeated keys, as a dict built from the pairs keeps).
fn merged(a: &[(PolicyMetric, f64)], b: &[(PolicyMetric, f64)]) -> Vec<(PolicyMetric, f64)> {
    let mut out: Vec<(PolicyMetric, f64)> = Vec::new();
    for (metric, limit) in a.iter().chain(b) {
        match out.iter_mut().find(|(m, _)| m == metric) {
            Some(entry) => entry.1 = *limit,
            None => out.push((*metric, *limit)),
        }
    }
    out
}

impl Slo {
    fn new(thresholds: &[(PolicyMetric, f64)], per_model: &[(String, Vec<(PolicyMetric, f64)>)]) -> Slo {
        let defaults = merged(thresholds, &[]);
        let mut models: HashMap<String, Vec<(PolicyMetric, f64)>> = HashMap::new();
        for (model, limits) in per_model {
            // A model named twice: the later block replaces the earlier (a dict's last key wins).
            models.insert(model.clone(), merged(&defaults, limits));
        }
        Slo { defaults, per_model: models }
    }

    /// `SloPolicy.matches`: any server-side request above one of its model's limits (a client's
    /// duration is another quantity). NaN is above nothing.
    fn matches(&self, records: &[Record<'_>]) -> bool {
        records.iter().filter(|record| record.side == Side::Server).any(|record| {
            let limits = if self.per_model.is_empty() {
                &self.defaults
            } else {
                self.per_model.get(record.model.as_ref()).unwrap_or(&self.defaults)
            };
            limits.iter().any(|(metric, limit)| metric.read(record).is_some_and(|value| value > *limit))
        })
    }
}

/// `SlowestPolicy`: above the rolling per-model quantile of each chosen metric, the threshold being
/// the quantile of the requests seen before this one (so a model's first request is kept).
#[derive(Debug)]
struct Slowest {
    metrics: Vec<PolicyMetric>,
    quantile: f64,
    /// An empty window of the policy's length: each new window is a copy.
    empty: RollingQuantile,
    /// `max_models * len(metrics)`: windows past it are the shared `__other__` model's.
    max_windows: usize,
    windows: Vec<RollingQuantile>,
    /// `_windows`' keys: model -> its window per metric (indexed as `PolicyMetric::ALL`). Bounded:
    /// a model gets a window only while fewer than `max_windows` exist. (Python's `_by_model`
    /// only caches what this look-up answers: a model's window never changes once chosen.)
    keys: HashMap<Box<str>, [Option<u32>; 5]>,
}

impl Slowest {
    /// `SlowestPolicy._window`: the model's window for a metric; past `max_models`, the shared one.
    fn window(&mut self, model: &str, metric: PolicyMetric) -> usize {
        let slot = metric as usize;
        if let Some(index) = self.keys.get(model).and_then(|slots| slots[slot]) {
            return index as usize;
        }
        let mut key = model;
        if self.windows.len() >= self.max_windows {
            key = OTHER_MODEL; // bounded memory under a flood of model names
            if let Some(index) = self.keys.get(key).and_then(|slots| slots[slot]) {
                return index as usize;
            }
        }
        let index = self.windows.len();
        self.windows.push(self.empty.clone());
        self.keys.entry(key.into()).or_default()[slot] = Some(index as u32);
        index
    }

    /// `SlowestPolicy.matches`: every value of every succeeded server-side request is compared with
    /// its window's threshold, then added to it (whatever the answer). Errors as Python raises them
    /// (see `Unbinnable`), with everything before them done.
    fn matches(&mut self, records: &[Record<'_>], now: f64) -> Result<bool, Unbinnable> {
        let mut slow = false;
        // The trace's slice, found at its first value: every window has the same length and slices.
        let mut slice: Option<Slice> = None;
        for record in records {
            if outcome::failed(&record.outcome) || record.side != Side::Server {
                continue;
            }
            for position in 0..self.metrics.len() {
                let metric = self.metrics[position];
                let Some(value) = metric.read(record) else { continue };
                let index = self.window(&record.model, metric);
                let window = &mut self.windows[index];
                let at = match slice {
                    Some(at) => at,
                    None => *slice.insert(window.slice_at(now)?),
                };
                let threshold = window.quantile_then_add(self.quantile, value, now, at)?;
                if threshold.is_none_or(|limit| value > limit) {
                    slow = true;
                }
            }
        }
        Ok(slow)
    }
}

/// `policies.threshold_for`: `round((1.0 - rate) * 2^56)`, Python's round (half to even).
fn threshold_for(rate: f64) -> Result<u64, String> {
    let threshold = ((1.0 - rate) * MAX_THRESHOLD as f64).round_ties_even();
    // NaN (Python's round raises) and a rate outside [0, 1] (the configuration refuses it; its
    // threshold would be negative or keep nothing) are refused.
    if !(0.0..=MAX_THRESHOLD as f64).contains(&threshold) {
        return Err(format!("a sampling rate must be within [0, 1], got {rate}"));
    }
    Ok(threshold as u64)
}

/// `policies.encode_threshold`: OTel `th`, 14 hex digits with trailing zeros removed ("0": keep all).
pub fn encode_threshold(threshold: u64) -> String {
    let text = format!("{threshold:014x}");
    let text = text.trim_end_matches('0');
    if text.is_empty() { "0".to_owned() } else { text.to_owned() }
}

/// `policies.randomness_of`: the trace id's rightmost 56 bits.
pub fn randomness_of(trace_id: &[u8; 16]) -> u64 {
    trace_id[9..16].iter().fold(0u64, |value, byte| value << 8 | u64::from(*byte))
}

#[derive(Debug)]
enum Matcher {
    Errors,
    Slo(Slo),
    Slowest(Box<Slowest>),
    Probabilistic { threshold: u64 },
}

#[derive(Debug)]
struct Policy {
    matcher: Matcher,
    /// `sampler._kept_by(policy)`: the decision a trace it keeps gets (the same for every trace).
    kept: Decision,
    /// Whether `rate_limit.applies_to` names it.
    limited: bool,
}

impl Policy {
    fn matches(&mut self, trace: &TraceData, records: &[Record<'_>], now: f64) -> Result<bool, DecideError> {
        let name = self.kept.policy;
        Ok(match &mut self.matcher {
            // `ErrorsPolicy.matches`: a request that failed (an error or an abort), or any span with status ERROR.
            Matcher::Errors => records.iter().any(|record| outcome::failed(&record.outcome))
                || trace.spans.iter().any(|span| span.status_code == STATUS_CODE_ERROR),
            Matcher::Slo(slo) => slo.matches(records),
            Matcher::Slowest(slowest) => slowest.matches(records, now)
                .map_err(|cause| DecideError::Window { policy: name, cause })?,
            // `ProbabilisticPolicy.matches`: a function of the trace id, the same on every replica.
            Matcher::Probabilistic { threshold } => randomness_of(&trace.trace_id) >= *threshold,
        })
    }
}

// --- the rate limit ----------------------------------------------------------------------------------

/// `policies.TokenBucket`: a burst of one second's worth and never less than one token (below
/// 1/s a bucket capped at `per_second` could never hold the token a trace takes).
#[derive(Clone, Debug)]
struct TokenBucket {
    per_second: f64,
    capacity: f64,
    tokens: f64,
    last: f64,
}

impl TokenBucket {
    fn new(per_second: f64, now: f64) -> TokenBucket {
        // Python's max(per_second, 1.0): the first unless the second is greater.
        let capacity = if 1.0 > per_second { 1.0 } else { per_second };
        TokenBucket { per_second, capacity, tokens: capacity, last: now }
    }

    /// `TokenBucket.take`.
    fn take(&mut self, now: f64) -> bool {
        let refilled = self.tokens + (now - self.last) * self.per_second;
        // Python's min(capacity, refilled): the second only where it is less (NaN is not).
        self.tokens = if refilled < self.capacity { refilled } else { self.capacity };
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        false
    }
}

/// `policies.RateLimit`: kept traces per second overall and per model (a trace's model is its
/// first record's), so one noisy model cannot starve the others. A trace over its model's limit
/// takes no overall token.
#[derive(Debug)]
struct RateLimit {
    overall: Option<TokenBucket>,
    per_model_rate: f64,
    models: HashMap<Box<str>, TokenBucket>,
    max_models: usize,
}

impl RateLimit {
    /// `RateLimit.allow` for a policy `applies_to` names.
    fn allow(&mut self, records: &[Record<'_>], now: f64) -> bool {
        if self.per_model_rate > 0.0 {
            let model = records.first().map_or(NO_MODEL, |record| record.model.as_ref());
            let allowed = match self.models.get_mut(model) {
                Some(bucket) => bucket.take(now),
                None => {
                    let key = if self.models.len() >= self.max_models { OTHER_MODEL } else { model };
                    match self.models.get_mut(key) {
                        Some(bucket) => bucket.take(now),
                        None => {
                            // A new bucket starts full at `now` (Python reads its clock in `__init__`).
                            let mut bucket = TokenBucket::new(self.per_model_rate, now);
                            let allowed = bucket.take(now);
                            self.models.insert(key.into(), bucket);
                            allowed
                        }
                    }
                }
            };
            if !allowed {
                return false;
            }
        }
        self.overall.as_mut().is_none_or(|bucket| bucket.take(now))
    }
}

// --- the sampler ------------------------------------------------------------------------------------

/// `sampler.TailSampler` with its Python policies (the reference: `core=None`).
#[derive(Debug)]
pub struct Sampler {
    policies: Vec<Policy>,
    rate_limit: Option<RateLimit>,
}

impl Sampler {
    /// `TailSampler(config)`: the policies in configuration order (`build_policies`), their names
    /// and thresholds interned in `names`, and the rate limit (`now`: the instant its overall
    /// bucket starts full at, Python's clock read in `TokenBucket.__init__`). Refused: what the
    /// configuration refuses and Python would raise on (a window not positive, a rate outside
    /// [0, 1] or NaN, a negative rate limit), and names `names` has no room for.
    pub fn new(config: &SamplerConfig, names: &mut Names, now: f64) -> Result<Sampler, String> {
        if !(config.traces_per_second >= 0.0 && config.per_model_traces_per_second >= 0.0) {
            return Err("rate_limit: rates must not be negative".into());
        }
        let exempt: Vec<&str> =
            config.policies.iter().filter(|p| p.rule == Rule::Errors).map(|p| p.name.as_str()).collect();
        let applies_to = |name: &str| {
            if config.applies_to.is_empty() {
                !exempt.contains(&name)
            } else {
                config.applies_to.iter().any(|n| n == name)
            }
        };
        let mut intern = |text: &str| match names.intern(text) {
            NameId(0) if !text.is_empty() => Err(format!("no room for the name {text:?} among the decisions' names")),
            id => Ok(id),
        };
        let always = intern("0")?;
        let mut policies = Vec::with_capacity(config.policies.len());
        for policy in &config.policies {
            let name = intern(&policy.name)?;
            let (matcher, threshold) = match &policy.rule {
                Rule::Errors => (Matcher::Errors, always),
                Rule::Slo { thresholds, per_model } => (Matcher::Slo(Slo::new(thresholds, per_model)), always),
                Rule::Slowest { metrics, quantile, window_s } => {
                    let slowest = Slowest {
                        metrics: metrics.clone(),
                        quantile: *quantile,
                        empty: RollingQuantile::new(*window_s, SLICES).map_err(|e| format!("policy {:?}: {e}", policy.name))?,
                        max_windows: config.max_models.saturating_mul(metrics.len()),
                        windows: Vec::new(),
                        keys: HashMap::new(),
                    };
                    (Matcher::Slowest(Box::new(slowest)), always)
                }
                Rule::Probabilistic { sampling_percentage } => {
                    let threshold = threshold_for(sampling_percentage / 100.0)
                        .map_err(|e| format!("policy {:?}: {e}", policy.name))?;
                    (Matcher::Probabilistic { threshold }, intern(&encode_threshold(threshold))?)
                }
            };
            policies.push(Policy {
                matcher,
                kept: Decision { keep: true, rate_limited: false, policy: name, threshold },
                limited: applies_to(&policy.name),
            });
        }
        let rate_limit = (config.traces_per_second > 0.0 || config.per_model_traces_per_second > 0.0).then(|| RateLimit {
            overall: (config.traces_per_second > 0.0).then(|| TokenBucket::new(config.traces_per_second, now)),
            per_model_rate: config.per_model_traces_per_second,
            models: HashMap::new(),
            max_models: config.max_models,
        });
        Ok(Sampler { policies, rate_limit })
    }

    /// `TailSampler.decide` (`_first_match`, then `_kept_or_rate_limited`): `DROP` when no policy
    /// matches; the first match's kept decision; or, over the rate limit, that policy's name with
    /// `keep` false and `rate_limited` true (threshold "").
    pub fn decide(&mut self, trace: &TraceData, records: &[Record<'_>], now: f64) -> Result<Decision, DecideError> {
        // Every policy sees every trace: no short-circuit (a raising one ends the loop, as in Python).
        let mut matched: Option<usize> = None;
        for (index, policy) in self.policies.iter_mut().enumerate() {
            if policy.matches(trace, records, now)? && matched.is_none() {
                matched = Some(index);
            }
        }
        let Some(index) = matched else { return Ok(DROP) };
        let policy = &self.policies[index];
        if let Some(limit) = self.rate_limit.as_mut() {
            if policy.limited && !limit.allow(records, now) {
                return Ok(Decision { keep: false, rate_limited: true, policy: policy.kept.policy, threshold: NameId(0) });
            }
        }
        Ok(policy.kept)
    }

    /// How many rolling windows the slowest policies hold (bounded by `max_models` per metric plus
    /// the shared ones), and how many per-model token buckets (bounded by `max_models` plus one).
    pub fn held(&self) -> (usize, usize) {
        let windows = self.policies.iter().map(|p| match &p.matcher {
            Matcher::Slowest(slowest) => slowest.windows.len(),
            _ => 0,
        }).sum();
        (windows, self.rate_limit.as_ref().map_or(0, |limit| limit.models.len()))
    }
}

#[cfg(test)]
mod tests;
