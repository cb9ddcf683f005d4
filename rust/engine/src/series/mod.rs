//! Both namings' span-derived metric families as native values (`llm_metrics/metrics/recorder.py`
//! `MetricsRecorder`, `families.py`, `exponential.py`; exposed as `exposition.py`'s
//! `RecorderCollector` has prometheus_client render them): label keys -> series, histograms with
//! per-model and exponential buckets, counters, exemplars of kept traces, the overflow series,
//! the shared byte budget and too-long label values.
//!
//! `record` is the hot path (one call per request record, no allocation once a record's label
//! keys are known); `render` and `snapshot` read under the engine's series lock.
//!
//! The accounting families (tenant tokens, cost, SLO: `accounting.py`) are another module's: they
//! are `CounterFamily`s drawing on this recorder's budget (`budget_mut`), recorded after `record`,
//! rendered through `render_with` where `RecorderCollector.collect` places them.

pub mod exponential;
pub mod family;
mod observe;
pub mod render;
pub mod snapshot;
pub mod spec;
mod value;

use crate::record::Record;

pub use family::{CounterFamily, Exemplar, KeyText, SeriesBudget, SeriesCost, OVERFLOW_KEY};
pub use render::AccountingFamilies;
pub use snapshot::Snapshot;
pub use spec::{
    CounterSpec, ExponentialLimits, HistogramSpec, LabelSource, MetricsSpec, NamingSpec, Number, SegmentsSpec, SpecError,
    ValueSpec,
};

use family::HistogramFamily;
use observe::{PlanNaming, PlanStep, SegmentCache, SidePlan, Sink, StepKind};
use spec::{exposed_name, histogram_metric_name, prometheus_label_name};

/// The label name a value past `max_label_value_bytes` is counted under when it is not one of the
/// key's named labels (`recorder._too_long`).
const DIMENSION: &str = "dimension";

/// A family as exposed (`recorder.ExposedHistogram`, `_BoundCounter`): a histogram family several
/// specs of a naming with the same name observe into, or a counter.
pub(crate) struct Exposed {
    /// Its position in `Series::hists` or `Series::counters`.
    pub family: usize,
    /// As declared (the first spec's, for a shared histogram family).
    pub name: String,
    pub unit: String,
    pub description: String,
    /// prometheus_client's `Metric.name` (a counter's samples add `_total`).
    pub metric_name: String,
    /// OTel names: the naming's labels, the dimensions, the fixed label, and a counter's
    /// `finished_reason`.
    pub label_names: Vec<String>,
    pub exposed_label_names: Vec<String>,
}

impl Exposed {
    fn new(family: usize, name: &str, unit: &str, description: &str, metric_name: String, label_names: Vec<String>) -> Exposed {
        Exposed {
            family,
            name: name.to_string(),
            unit: unit.to_string(),
            description: description.to_string(),
            metric_name,
            exposed_label_names: label_names.iter().map(|n| prometheus_label_name(n)).collect(),
            label_names,
        }
    }
}

/// `recorder.BoundNaming`, as exposition and snapshots walk it.
pub(crate) struct BoundNaming {
    pub key: String,
    pub schema_url: String,
    pub histograms: Vec<Exposed>,
    pub counters: Vec<Exposed>,
}

/// Requests counted per label whose value was too long (`MetricsRecorder.too_long`).
struct TooLong {
    names: Vec<String>,
    counts: Vec<u64>,
}

impl TooLong {
    fn id(&mut self, name: &str) -> u16 {
        match self.names.iter().position(|n| n == name) {
            Some(at) => at as u16,
            None => {
                self.names.push(name.to_string());
                self.counts.push(0);
                (self.names.len() - 1) as u16
            }
        }
    }
}

/// `MetricsRecorder` with its compiled observers (`core=None`'s semantics), natively.
pub struct Series {
    namings: Vec<BoundNaming>,
    /// `definitions.SEGMENT_METRIC`, the last of `hists`.
    segments: Exposed,
    hists: Vec<HistogramFamily>,
    counters: Vec<CounterFamily>,
    sides: [Option<SidePlan>; 2],
    segment_cache: SegmentCache,
    budget: SeriesBudget,
    too_long: TooLong,
    dimension_too_long: u16,
    max_label_value_bytes: usize,
    requests_recorded: u64,
    not_a_number: u64,
    exponential: Option<ExponentialLimits>,
    /// `otel_llm_series_overflow`'s `metric` label of each family in `families()` order
    /// (segments, then each naming's histograms and counters).
    overflow_names: Vec<String>,
}

impl Series {
    /// `MetricsRecorder(namings, dimension_names, series_limit, series_limit_bytes,
    /// max_label_value_bytes, core=None)`, then `keep_exponential` if `spec.exponential` is set.
    pub fn new(spec: &MetricsSpec) -> Result<Series, SpecError> {
        spec.check()?;
        let limit = spec.series_limit;
        let dimensions = &spec.dimension_names;
        let mut too_long = TooLong { names: Vec::new(), counts: Vec::new() };
        let mut hists: Vec<HistogramFamily> = Vec::new();
        let mut counters: Vec<CounterFamily> = Vec::new();
        let mut namings = Vec::new();
        let mut plan_namings: [Vec<PlanNaming<'_>>; 2] = [Vec::new(), Vec::new()];
        for naming in &spec.namings {
            // `_bind`
            let label_names: Vec<String> = naming.label_names.iter().chain(dimensions).cloned().collect();
            let exposed_labels: Vec<String> = label_names.iter().map(|n| prometheus_label_name(n)).collect();
            let mut bound = BoundNaming {
                key: naming.key.clone(),
                schema_url: naming.schema_url.clone(),
                histograms: Vec::new(),
                counters: Vec::new(),
            };
            let mut steps = Vec::new();
            for spec in &naming.histograms {
                let family = match bound.histograms.iter().find(|h| h.name == spec.name) {
                    Some(shared) => shared.family,
                    None => {
                        let mut names = label_names.clone();
                        names.extend(spec.fixed_label.as_ref().map(|(name, _)| name.clone()));
                        let exposed = Exposed::new(hists.len(), &spec.name, &spec.unit, &spec.description,
                                                   histogram_metric_name(&spec.name, &spec.unit), names);
                        let budget_names: Vec<&str> =
                            exposed.exposed_label_names.iter().map(String::as_str).chain(std::iter::once("le")).collect();
                        hists.push(HistogramFamily::new(&spec.name, spec.buckets.clone(), limit, &budget_names,
                                                        &spec.buckets_by_model));
                        bound.histograms.push(exposed);
                        hists.len() - 1
                    }
                };
                steps.push(PlanStep {
                    family,
                    value: &spec.value,
                    suffix: spec.fixed_label.as_ref().map(|(_, value)| value.as_str()),
                    kind: StepKind::Histogram { success_only: spec.success_only, per_step: spec.per_step },
                });
            }
            for spec in &naming.counters {
                let fixed = spec.fixed_label.as_ref().map(|(name, _)| name.clone());
                // The family's names for the byte estimate: the labels, finished_reason, the fixed label.
                let budget_names: Vec<String> = exposed_labels
                    .iter()
                    .cloned()
                    .chain(std::iter::once("finished_reason".to_string()))
                    .chain(fixed.iter().map(|n| prometheus_label_name(n)))
                    .collect();
                counters.push(CounterFamily::new(&spec.name, limit, &budget_names));
                let names: Vec<String> = label_names
                    .iter()
                    .cloned()
                    .chain(fixed)
                    .chain(spec.by_outcome.then(|| "finished_reason".to_string()))
                    .collect();
                bound.counters.push(Exposed::new(counters.len() - 1, &spec.name, &spec.unit, &spec.description,
                                                 exposed_name(&spec.name, &spec.unit), names));
                steps.push(PlanStep {
                    family: counters.len() - 1,
                    value: &spec.value,
                    suffix: spec.fixed_label.as_ref().map(|(_, value)| value.as_str()),
                    kind: StepKind::Counter { by_outcome: spec.by_outcome },
                });
            }
            plan_namings[observe::side_index(naming.side)].push(PlanNaming {
                too_long_ids: exposed_labels.iter().map(|n| too_long.id(n)).collect(),
                label_names,
                labels: &naming.labels,
                steps,
            });
            namings.push(bound);
        }
        // `_Plan.cache_limit`, `_segment_cache_limit`: bounded whatever the label keys.
        let cache_limit = limit.saturating_mul(4).saturating_add(64);
        let sides = plan_namings.map(|side| (!side.is_empty()).then(|| SidePlan::new(&side, cache_limit)));

        let segment_names: Vec<String> = ["model_name", "engine_kind", "service_name", "segment"]
            .iter()
            .map(|n| n.to_string())
            .chain(dimensions.iter().cloned())
            .collect();
        let budget_names: Vec<&str> = segment_names.iter().map(String::as_str).chain(std::iter::once("le")).collect();
        hists.push(HistogramFamily::new(&spec.segments.name, spec.segments.buckets.clone(), limit, &budget_names, &[]));
        let segments = Exposed::new(hists.len() - 1, &spec.segments.name, &spec.segments.unit, &spec.segments.description,
                                    histogram_metric_name(&spec.segments.name, &spec.segments.unit), segment_names.clone());
        // `_segment_entry`'s names: the segment label itself is not part of the cached key.
        let segment_ids = segment_names
            .iter()
            .enumerate()
            .filter(|(position, _)| *position != 3)
            .map(|(_, name)| too_long.id(name))
            .collect();
        let dimension_too_long = too_long.id(DIMENSION);

        // `RecorderCollector.collect`'s units (the last family of a name wins) for the overflow count.
        let mut units: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        for naming in &namings {
            for hist in &naming.histograms {
                units.insert(&hist.name, &hist.unit);
            }
            for counter in &naming.counters {
                units.insert(&counter.name, &counter.unit);
            }
        }
        let overflow_name = |name: &str| exposed_name(name, units.get(name).copied().unwrap_or("s"));
        let mut overflow_names = vec![overflow_name(&spec.segments.name)];
        for naming in &namings {
            overflow_names.extend(naming.histograms.iter().chain(&naming.counters).map(|f| overflow_name(&f.name)));
        }

        let mut series = Series {
            namings,
            segments,
            hists,
            counters,
            sides,
            segment_cache: SegmentCache::new(cache_limit, segment_ids),
            budget: SeriesBudget::new(spec.series_limit_bytes),
            too_long,
            dimension_too_long,
            max_label_value_bytes: spec.max_label_value_bytes,
            requests_recorded: 0,
            not_a_number: 0,
            exponential: None,
            overflow_names,
        };
        if let Some(limits) = spec.exponential {
            series.keep_exponential(limits)?;
        }
        Ok(series)
    }

    /// `MetricsRecorder.keep_exponential`: every histogram series keeps base-2 exponential buckets
    /// too, within the largest limits asked for; only before the first observation.
    pub fn keep_exponential(&mut self, limits: ExponentialLimits) -> Result<(), SpecError> {
        limits.check()?;
        if self.hists.iter().any(HistogramFamily::has_series) {
            return Err(SpecError("exponential buckets must be asked for before the first observation".into()));
        }
        let merged = limits.merged(self.exponential);
        self.exponential = Some(merged);
        for family in &mut self.hists {
            family.set_exponential(Some(merged));
        }
        Ok(())
    }

    /// `MetricsRecorder.record` (without the accounting, recorded after it): observes `record` in
    /// every naming of its side and its segments; `with_exemplars` only for traces the sampler
    /// kept, with `now_unix_s` as the exemplars' time.
    pub fn record(&mut self, record: &Record<'_>, with_exemplars: bool, now_unix_s: f64) {
        self.requests_recorded += 1;
        let exemplar = with_exemplars.then_some(Exemplar {
            trace_id: record.trace_id,
            span_id: record.span_id,
            value: 0.0,
            timestamp: now_unix_s,
        });
        let mut sink = Sink {
            hists: &mut self.hists,
            counters: &mut self.counters,
            budget: &mut self.budget,
            max_label_value_bytes: self.max_label_value_bytes,
            dimension_too_long: self.dimension_too_long,
            not_a_number: &mut self.not_a_number,
        };
        let mut too_long = None;
        if let Some(plan) = &mut self.sides[observe::side_index(record.side)] {
            too_long = plan.record(&mut sink, record, exemplar.as_ref());
        }
        if !record.segments.is_empty() {
            let segments = self.segment_cache.record(&mut sink, self.segments.family, record, exemplar.as_ref());
            too_long = too_long.or(segments);
        }
        if let Some(label) = too_long {
            self.too_long.counts[label as usize] += 1;
        }
    }

    /// `MetricsRecorder.requests_recorded`.
    pub fn requests_recorded(&self) -> u64 {
        self.requests_recorded
    }

    /// Values a spec could not observe because they were not numbers (a text or a missing
    /// sequence where the declaration reads a number: Python raises `TypeError` there; no
    /// declared spec reads one).
    pub fn not_a_number(&self) -> u64 {
        self.not_a_number
    }

    /// The byte budget every family draws on (the accounting families' too).
    pub fn budget(&self) -> SeriesBudget {
        self.budget
    }

    pub fn budget_mut(&mut self) -> &mut SeriesBudget {
        &mut self.budget
    }

    /// `MetricsRecorder.too_long`: requests per label whose value was too long, by label name.
    pub fn too_long(&self) -> Vec<(&str, u64)> {
        let mut out: Vec<(&str, u64)> = self
            .too_long
            .names
            .iter()
            .zip(&self.too_long.counts)
            .filter(|(_, &count)| count > 0)
            .map(|(name, &count)| (name.as_str(), count))
            .collect();
        out.sort_unstable();
        out
    }

    /// The exponential limits every histogram series keeps (`keep_exponential`), if any.
    pub fn exponential(&self) -> Option<ExponentialLimits> {
        self.exponential
    }
}

#[cfg(test)]
mod tests;
