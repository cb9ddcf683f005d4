//! Tenant tokens, their cost and SLO attainment per request record: counters beside the namings
//! (`processor/llm_metrics/metrics/accounting.py` `Accounting`, and `families.py`'s
//! `CounterFamily` for its four counters).
//!
//! Which records: tokens and cost count every server-side record, and the client-side records no
//! engine span served (`joined_span_id` empty: a gateway or SDK calling a provider whose engine
//! sends no spans), so a request is never counted twice. SLO attainment counts server-side
//! records only.
//!
//! The boundary with the namings' families (`series`): the four counters share the recorder's
//! byte budget with every other family (`ByteBudget`, passed to `record`), each family caps its
//! series at `series_limit` (its overflow series included, as in Python), and the exposition
//! reads them as prometheus_client `Metric`s (`snapshot`) or as text (`render`), in the place
//! `RecorderCollector.collect` yields them (after the namings' counters, before the segment
//! histogram); `overflowed` gives `otel_llm_series_overflow_total`'s samples of these families.

use std::collections::{BTreeMap, HashMap};

use crate::record::{Record, Side};

pub mod exposition;

use exposition::{legacy_name, MetricFamily, Sample};

/// `accounting.PER_MILLION`: prices are per million tokens.
const PER_MILLION: f64 = 1e6;
/// `accounting.TOKEN_TYPES`, in `token_split`'s order.
pub const TOKEN_TYPES: [&str; 3] = ["input", "cached_input", "output"];
pub const MET: &str = "met";
pub const MISSED: &str = "missed";
pub const UNMEASURED: &str = "unmeasured";

/// `accounting.Price`: per million tokens; None = not priced.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Price {
    pub input: Option<f64>,
    pub output: Option<f64>,
    /// None: a cached prompt token costs `input`.
    pub cached_input: Option<f64>,
}

/// `accounting.Objectives`: thresholds a request must not exceed and the attainment target.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Objectives {
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub target: Option<f64>,
}

impl Objectives {
    /// `Objectives.any`: at least one threshold (a target alone measures nothing).
    pub fn any(&self) -> bool {
        self.ttft_s.is_some() || self.tpot_s.is_some() || self.e2e_s.is_some()
    }
}

/// `accounting.AccountingSettings` (as `stage.accounting_settings` makes them from the configuration).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AccountingSettings {
    /// A tenant or a price table is configured: tokens are counted.
    pub tokens: bool,
    pub currency: String,
    /// Model label -> its prices.
    pub prices: HashMap<String, Price>,
    pub default_objectives: Option<Objectives>,
    /// Model label -> its objectives, merged with the default already.
    pub objectives_by_model: HashMap<String, Objectives>,
}

/// `definitions.AccountingSpec`: a family's Prometheus name, description and label names, as
/// Python declares them (`TENANT_TOKENS`, `REQUEST_COST`, `UNPRICED_TOKENS`, `SLO_REQUESTS`,
/// `SLO_TARGET`), handed over at construction.
#[derive(Clone, Debug, PartialEq)]
pub struct AccountingSpec {
    pub name: String,
    pub description: String,
    pub label_names: Vec<String>,
}

/// The five families' declarations, in `ACCOUNTING_METRICS`' order.
#[derive(Clone, Debug, PartialEq)]
pub struct AccountingSpecs {
    pub tenant_tokens: AccountingSpec,
    pub request_cost: AccountingSpec,
    pub unpriced_tokens: AccountingSpec,
    pub slo_requests: AccountingSpec,
    pub slo_target: AccountingSpec,
}

/// `accounting.slo_status`: `missed` when the request failed or a reported quantity exceeds its
/// threshold (a value equal to it meets it, as a histogram bucket's `le`); else `unmeasured` when a
/// configured quantity was not reported; else `met`. NaN exceeds nothing.
pub fn slo_status(record: &Record<'_>, objectives: &Objectives) -> &'static str {
    if !record.succeeded() {
        return MISSED;
    }
    let mut unmeasured = false;
    for (threshold, value) in [(objectives.ttft_s, record.ttft_s), (objectives.tpot_s, record.tpot_s),
                               (objectives.e2e_s, record.e2e_s)] {
        let Some(threshold) = threshold else { continue };
        match value {
            None => unmeasured = true,
            Some(value) if value > threshold => return MISSED,
            Some(_) => {}
        }
    }
    if unmeasured { UNMEASURED } else { MET }
}

/// `accounting.token_split`: (input not from a cache, cached input, output). Cached tokens more
/// than the prompt's (or negative) are not a split anyone can price: the prompt is counted as
/// input, the cached count left out.
pub fn token_split(record: &Record<'_>) -> [Option<i64>; 3] {
    match (record.prompt_tokens, record.cached_tokens) {
        (Some(prompt), Some(cached)) if 0 <= cached && cached <= prompt => {
            [Some(prompt - cached), Some(cached), record.completion_tokens]
        }
        (prompt, _) => [prompt, None, record.completion_tokens],
    }
}

// --- the byte budget and the counter families --------------------------------------------------------

/// `families.SeriesBudget.take`: the bytes of exposition every family's series together may take,
/// shared by the recorder's families; a new series takes its estimated bytes or is refused.
pub trait ByteBudget {
    fn take(&mut self, cost: u64) -> bool;
}

/// `families.SeriesBudget` (for a recorder whose families are these only, and for tests; the
/// engine's recorder has one budget for every family, which implements `ByteBudget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeriesBudget {
    pub limit: u64,
    pub used: u64,
}

impl ByteBudget for SeriesBudget {
    fn take(&mut self, cost: u64) -> bool {
        if self.used.saturating_add(cost) > self.limit {
            return false;
        }
        self.used += cost;
        true
    }
}

/// `families._LINE_OVERHEAD`: a name's suffix and translation, `le="..."`, the value and separators.
const LINE_OVERHEAD: usize = 16 + 8 + 30;

/// A series' labels, or the overflow series (`Family.OVERFLOW`).
#[derive(Clone, Debug, PartialEq)]
enum SeriesKey {
    Labels([Box<str>; 3]),
    Overflow,
}

/// `families.CounterFamily` of three labels: series in the order they were made (a dict's), capped
/// at `limit` series (the overflow series counted among them) and by the shared byte budget.
#[derive(Debug)]
struct CounterFamily {
    name: String,
    limit: usize,
    series: Vec<(SeriesKey, f64)>,
    /// Labels (each as its length and bytes) -> position in `series`.
    index: HashMap<Box<[u8]>, usize>,
    overflow: Option<usize>,
    overflowed: u64,
    /// `_line_bytes + _label_names_bytes`: one sample line per series.
    fixed_bytes: usize,
    scratch: Vec<u8>,
}

impl CounterFamily {
    fn new(spec: &AccountingSpec, limit: usize) -> CounterFamily {
        let label_names_bytes: usize = spec.label_names.iter().map(|n| n.len() + 4).sum();
        CounterFamily {
            name: spec.name.clone(),
            limit,
            series: Vec::new(),
            index: HashMap::new(),
            overflow: None,
            overflowed: 0,
            fixed_bytes: spec.name.len() + LINE_OVERHEAD + label_names_bytes,
            scratch: Vec::new(),
        }
    }

    /// `Family.has_room`: under the cap, and the series' estimated bytes (its labels as exposed:
    /// UTF-8, with `\`, `"` and newline escaped) taken from the budget.
    fn has_room(&self, key: [&str; 3], budget: &mut impl ByteBudget) -> bool {
        if self.series.len() >= self.limit {
            return false;
        }
        let label_bytes: usize = key.iter()
            .map(|value| value.len() + value.bytes().filter(|b| matches!(b, b'\\' | b'"' | b'\n')).count())
            .sum();
        budget.take((self.fixed_bytes + label_bytes) as u64)
    }

    /// `CounterFamily.add`: `amount` on the key's series, made if it fits (`_admit`), else on the
    /// overflow series, counted.
    fn add(&mut self, key: [&str; 3], amount: f64, budget: &mut impl ByteBudget) {
        self.scratch.clear();
        for value in key {
            self.scratch.extend_from_slice(&(value.len() as u64).to_le_bytes());
            self.scratch.extend_from_slice(value.as_bytes());
        }
        if let Some(at) = self.index.get(self.scratch.as_slice()) {
            self.series[*at].1 += amount;
            return;
        }
        if self.has_room(key, budget) {
            self.index.insert(self.scratch.as_slice().into(), self.series.len());
            self.series.push((SeriesKey::Labels(key.map(Box::from)), 0.0 + amount));
        } else {
            self.add_overflow(amount);
        }
    }

    /// `CounterFamily.add_overflow`: `amount` on the overflow series (a label value too long for a
    /// series of its own, or no room), counted.
    fn add_overflow(&mut self, amount: f64) {
        self.overflowed += 1;
        match self.overflow {
            Some(at) => self.series[at].1 += amount,
            None => {
                self.overflow = Some(self.series.len());
                self.series.push((SeriesKey::Overflow, 0.0 + amount));
            }
        }
    }
}

/// `accounting.Accounting`: the counters; the recorder calls `record` under its lock, the
/// exposition `snapshot`s or `render`s.
#[derive(Debug)]
pub struct Accounting {
    settings: AccountingSettings,
    specs: AccountingSpecs,
    max_label_value_bytes: usize,
    tokens: CounterFamily,
    cost: CounterFamily,
    unpriced: CounterFamily,
    slo: CounterFamily,
    /// Model label -> its attainment target, for the models counted (at most `targets_limit`).
    targets: BTreeMap<String, f64>,
    targets_limit: usize,
}

impl Accounting {
    /// `Accounting(settings, series_limit, budget, max_label_value_bytes)` with the families Python
    /// declares (`specs`); refused where a declaration would not expose as Python's does (a name
    /// not legacy-valid, a counter without three labels).
    pub fn new(settings: AccountingSettings, specs: AccountingSpecs, series_limit: usize,
               max_label_value_bytes: usize) -> Result<Accounting, String> {
        for spec in [&specs.tenant_tokens, &specs.request_cost, &specs.unpriced_tokens, &specs.slo_requests,
                     &specs.slo_target] {
            let counter = spec != &specs.slo_target;
            if !legacy_name(&spec.name, true) || !spec.label_names.iter().all(|n| legacy_name(n, false))
                || (counter && spec.label_names.len() != 3) {
                return Err(format!("accounting family {:?} ({:?}): a legacy Prometheus name{}", spec.name,
                                   spec.label_names, if counter { " and three label names" } else { "" }));
            }
        }
        Ok(Accounting {
            tokens: CounterFamily::new(&specs.tenant_tokens, series_limit),
            cost: CounterFamily::new(&specs.request_cost, series_limit),
            unpriced: CounterFamily::new(&specs.unpriced_tokens, series_limit),
            slo: CounterFamily::new(&specs.slo_requests, series_limit),
            settings,
            specs,
            max_label_value_bytes,
            targets: BTreeMap::new(),
            targets_limit: series_limit,
        })
    }

    /// `Accounting.objectives_of`: the model's objectives (else the default), where any is a threshold.
    pub fn objectives_of(&self, model: &str) -> Option<&Objectives> {
        let found = self.settings.objectives_by_model.get(model).or(self.settings.default_objectives.as_ref());
        found.filter(|objectives| objectives.any())
    }

    /// `Accounting._too_long`: a label value over `max_label_value_bytes` in UTF-8. (Python checks
    /// its length in characters first, a shortcut the byte length implies: a string over `limit`
    /// bytes has more than `limit // 4` characters.)
    fn too_long(&self, value: &str) -> bool {
        value.len() > self.max_label_value_bytes
    }

    /// `Accounting.record`: the request's SLO status (server side, a model with objectives), its
    /// tokens by type and, with a price table, their cost or their being unpriced. A label value
    /// too long for a series of its own sends the request to each family's overflow series.
    pub fn record(&mut self, record: &Record<'_>, budget: &mut impl ByteBudget) {
        let weight = record.weight;
        let (model, tenant) = (record.model.as_ref(), record.tenant.as_ref());
        let too_long = self.too_long(model) || self.too_long(tenant);
        if let Some(objectives) = self.objectives_of(model).copied() {
            if record.side == Side::Server {
                let engine_kind = record.engine_kind.as_ref();
                let status = slo_status(record, &objectives);
                let too_long = too_long || self.too_long(engine_kind);
                add(&mut self.slo, [model, engine_kind, status], too_long, weight, budget);
                if let Some(target) = objectives.target {
                    if self.targets.contains_key(model) || self.targets.len() < self.targets_limit {
                        self.targets.insert(model.to_owned(), target);
                    }
                }
            }
        }
        if !self.settings.tokens || (record.side != Side::Server && record.joined_span_id.is_some()) {
            return;
        }
        let per_million = self.settings.prices.get(model).map(|price| {
            [price.input, price.cached_input.or(price.input), price.output]
        });
        let mut cost = 0.0;
        let mut priced = false;
        for (position, count) in token_split(record).into_iter().enumerate() {
            let Some(count) = count.filter(|count| *count != 0) else { continue };
            let token_type = TOKEN_TYPES[position];
            // Python's int * float: the count rounded to the nearest float, as `as f64` rounds it.
            let amount = count as f64 * weight;
            add(&mut self.tokens, [model, tenant, token_type], too_long, amount, budget);
            if self.settings.prices.is_empty() {
                continue;
            }
            match per_million.and_then(|prices| prices[position]) {
                None => add(&mut self.unpriced, [model, tenant, token_type], too_long, amount, budget),
                Some(price) => {
                    cost += amount * price / PER_MILLION;
                    priced = true;
                }
            }
        }
        if priced {
            add(&mut self.cost, [model, tenant, &self.settings.currency], too_long, cost, budget);
        }
    }

    /// `Accounting.collect(overflow_labels)`: the counter families that have series, then the
    /// targets gauge (models sorted) if any model was counted with a target. `overflow_labels`:
    /// `exposition.OVERFLOW_LABELS` (`otel_metric_overflow="true"`), legacy-valid label names as
    /// every name here (the encoders' name escaping is then the identity).
    pub fn snapshot(&self, overflow_labels: &[(&str, &str)]) -> Vec<MetricFamily> {
        let mut out = Vec::new();
        for (family, spec) in [(&self.tokens, &self.specs.tenant_tokens), (&self.cost, &self.specs.request_cost),
                               (&self.unpriced, &self.specs.unpriced_tokens), (&self.slo, &self.specs.slo_requests)] {
            if family.series.is_empty() {
                continue;
            }
            let samples = family.series.iter().map(|(key, value)| Sample {
                name: format!("{}_total", spec.name),
                labels: match key {
                    SeriesKey::Overflow => overflow_labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                    SeriesKey::Labels(values) => spec.label_names.iter().cloned()
                        .zip(values.iter().map(|v| v.to_string())).collect(),
                },
                value: *value,
            }).collect();
            out.push(MetricFamily { name: spec.name.clone(), documentation: spec.description.clone(), kind: "counter",
                                    unit: String::new(), samples });
        }
        if !self.targets.is_empty() {
            let spec = &self.specs.slo_target;
            // Python labels the gauge "model_name" itself, whatever the declaration's label names.
            let samples = self.targets.iter().map(|(model, target)| Sample {
                name: spec.name.clone(),
                labels: vec![("model_name".to_owned(), model.clone())],
                value: *target,
            }).collect();
            out.push(MetricFamily { name: spec.name.clone(), documentation: spec.description.clone(), kind: "gauge",
                                    unit: String::new(), samples });
        }
        out
    }

    /// The families of `snapshot` as prometheus_client encodes them (text 0.0.4, or OpenMetrics
    /// without its closing `# EOF`), appended to `out`.
    pub fn render(&self, openmetrics: bool, overflow_labels: &[(&str, &str)], out: &mut String) {
        for family in self.snapshot(overflow_labels) {
            exposition::encode(&family, openmetrics, out);
        }
    }

    /// Each counter family's name and the observations its overflow series took, in
    /// `Accounting.families`' order (the recorder's `otel_llm_series_overflow_total` samples).
    pub fn overflowed(&self) -> [(&str, u64); 4] {
        [(&self.tokens.name, self.tokens.overflowed), (&self.cost.name, self.cost.overflowed),
         (&self.unpriced.name, self.unpriced.overflowed), (&self.slo.name, self.slo.overflowed)]
    }

    /// How many series the four counter families hold (each bounded by `series_limit`).
    pub fn series(&self) -> usize {
        self.tokens.series.len() + self.cost.series.len() + self.unpriced.series.len() + self.slo.series.len()
    }
}

/// `Accounting._add`: on the key's series, or on the overflow series where a label is too long.
fn add(family: &mut CounterFamily, key: [&str; 3], too_long: bool, amount: f64, budget: &mut impl ByteBudget) {
    if too_long {
        family.add_overflow(amount);
    } else {
        family.add(key, amount, budget);
    }
}

#[cfg(test)]
mod tests;
