//! A copy of every family's state as plain data, for what reads the recorder besides the text
//! exposition: the OTLP metrics push (`exporter/otlp_metrics/exporter.py` `take_snapshot`: OTel
//! names, series keys, counts, sums, exemplars, exponential buckets), the Prometheus protobuf
//! exposition with native histograms (`exporter/prometheus/protobuf.py`: exposed names and labels,
//! cumulative buckets, the exponential state fitted to schema 8) and the web view
//! (`extension/webview/history.py`, which reads the same families by exposed name and label).

use super::exponential::ExponentialState;
use super::family::{Exemplar, HistogramFamily, KeyText, OVERFLOW_KEY};
use super::render::OVERFLOW_LABEL;
use super::{BoundNaming, Exposed, Series};

/// Every family, in `RecorderCollector.collect`'s order: each naming's histograms then counters,
/// then the segments family (the accounting module's families go between the two).
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub families: Vec<FamilySnapshot>,
    /// `otel_llm_series_overflow`: (exposed family name, observations sent to its overflow
    /// series), in `MetricsRecorder.families()` order.
    pub overflowed: Vec<(String, u64)>,
    /// `MetricsRecorder.too_long`, sorted by label name.
    pub too_long: Vec<(String, u64)>,
    pub budget_used: u64,
    pub budget_limit: u64,
    pub requests_recorded: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FamilyKind {
    Histogram,
    Counter,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FamilySnapshot {
    pub kind: FamilyKind,
    /// The naming's key ("" for the segments family).
    pub naming: String,
    /// The naming's schema URL ("" = none).
    pub schema_url: String,
    /// As declared (the OTLP metric name).
    pub name: String,
    /// prometheus_client's `Metric.name`: a histogram's with its unit word, a counter's without
    /// `_total` (its samples add it).
    pub exposed_name: String,
    pub unit: String,
    pub description: String,
    /// As declared (OTLP attribute names), one per key value.
    pub label_names: Vec<String>,
    /// As exposed (Prometheus label names).
    pub exposed_label_names: Vec<String>,
    /// The family's bounds (histograms; a series may have its own).
    pub bounds: Vec<f64>,
    pub series: Vec<SeriesSnapshot>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SeriesSnapshot {
    /// The label values (`Family.OVERFLOW`, `["__overflow__"]`, for the overflow series).
    pub key: Vec<String>,
    pub overflow: bool,
    pub value: SeriesValue,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SeriesValue {
    Counter(f64),
    Histogram(Box<HistogramPoint>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct HistogramPoint {
    /// Per bucket, not cumulative; the last is +Inf.
    pub counts: Vec<f64>,
    pub sum: f64,
    pub count: f64,
    /// Its upper bounds (its model's, or the family's).
    pub bounds: Vec<f64>,
    /// (bucket index, latest exemplar), ascending.
    pub exemplars: Vec<(usize, Exemplar)>,
    /// Its exponential state (`ExponentialState::fitted` makes what an exporter's limits allow).
    pub exponential: Option<ExponentialState>,
}

impl SeriesSnapshot {
    /// `exposition._labels`: `dict(zip(names, key))` in insertion order (a repeated name keeps its
    /// first place and its last value), or the overflow label; as the protobuf exposition writes them.
    pub fn labels<'a>(&'a self, names: &'a [String]) -> Vec<(&'a str, &'a str)> {
        if self.overflow {
            return vec![OVERFLOW_LABEL];
        }
        let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(names.len());
        for (name, value) in names.iter().zip(&self.key) {
            match pairs.iter_mut().find(|(n, _)| *n == name.as_str()) {
                Some(pair) => pair.1 = value,
                None => pairs.push((name.as_str(), value.as_str())),
            }
        }
        pairs
    }
}

fn key_of(key: Option<&KeyText>) -> (Vec<String>, bool) {
    match key {
        Some(key) => (key.values().map(str::to_string).collect(), false),
        None => (vec![OVERFLOW_KEY.to_string()], true),
    }
}

fn histogram_series(family: &HistogramFamily) -> Vec<SeriesSnapshot> {
    family
        .family
        .series
        .iter()
        .map(|series| {
            let (key, overflow) = key_of(series.key.as_ref());
            let exemplars = series.exemplars.iter().enumerate().filter_map(|(i, e)| e.map(|e| (i, e))).collect();
            SeriesSnapshot {
                key,
                overflow,
                value: SeriesValue::Histogram(Box::new(HistogramPoint {
                    counts: series.counts.clone(),
                    sum: series.total,
                    count: series.count,
                    bounds: family.bounds_of(series).to_vec(),
                    exemplars,
                    exponential: series.exponential.as_deref().cloned(),
                })),
            }
        })
        .collect()
}

fn family_snapshot(kind: FamilyKind, naming: Option<&BoundNaming>, exposed: &Exposed, bounds: &[f64],
                   series: Vec<SeriesSnapshot>) -> FamilySnapshot {
    FamilySnapshot {
        kind,
        naming: naming.map_or_else(String::new, |n| n.key.clone()),
        schema_url: naming.map_or_else(String::new, |n| n.schema_url.clone()),
        name: exposed.name.clone(),
        exposed_name: exposed.metric_name.clone(),
        unit: exposed.unit.clone(),
        description: exposed.description.clone(),
        label_names: exposed.label_names.clone(),
        exposed_label_names: exposed.exposed_label_names.clone(),
        bounds: bounds.to_vec(),
        series,
    }
}

impl Series {
    fn histogram_snapshot(&self, naming: Option<&BoundNaming>, exposed: &Exposed) -> FamilySnapshot {
        let family = &self.hists[exposed.family];
        family_snapshot(FamilyKind::Histogram, naming, exposed, &family.bounds, histogram_series(family))
    }

    /// Every family's state now (the caller holds the series lock, as `take_snapshot` holds the
    /// recorder's).
    pub fn snapshot(&self) -> Snapshot {
        let mut families = Vec::new();
        for naming in &self.namings {
            for hist in &naming.histograms {
                families.push(self.histogram_snapshot(Some(naming), hist));
            }
            for counter in &naming.counters {
                let series = self.counters[counter.family]
                    .totals()
                    .map(|(key, value)| {
                        let (key, overflow) = key_of(key);
                        SeriesSnapshot { key, overflow, value: SeriesValue::Counter(value) }
                    })
                    .collect();
                families.push(family_snapshot(FamilyKind::Counter, Some(naming), counter, &[], series));
            }
        }
        families.push(self.histogram_snapshot(None, &self.segments));
        Snapshot {
            families,
            overflowed: self.overflow_counts().map(|(name, count)| (name.to_string(), count)).collect(),
            too_long: self.too_long().into_iter().map(|(name, count)| (name.to_string(), count)).collect(),
            budget_used: self.budget.used,
            budget_limit: self.budget.limit,
            requests_recorded: self.requests_recorded,
        }
    }
}
