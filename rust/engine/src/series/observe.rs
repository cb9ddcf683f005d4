//! The per-record loop (`recorder.py` `MetricsRecorder.record`, the observer `_compile` generates
//! and `_native_ops` declares): per side, the namings' steps in declaration order, namings with the
//! same labels sharing one label key and one cache lookup; then the record's segments.
//!
//! The label-key caches only save lookups (a series, once made, stays; a key without room never
//! gets any), so they are bounded and cleared as Python's `_Plan.cache` is, and an entry resolves
//! each of its series on its first observation, as `_slots`/`_resolve` do: series are made, and
//! draw on the byte budget, in exactly Python's order.

use hashbrown::HashTable;

use crate::record::{FieldValue, Record, RecordField, Side};

use super::family::{
    bisect_left, CounterFamily, CounterTarget, Exemplar, HistogramFamily, KeyScratch, KeyText, SeriesBudget,
};
use super::spec::{LabelSource, ValueSpec};
use super::value::{evaluate, Eval, Num};

/// A by-outcome counter keeps this many outcomes' series per label key; further outcomes (only a
/// hostile record has them) are looked up in the family each time.
const OUTCOMES_PER_KEY: usize = 8;
/// Segment names a segment label key keeps the series of, likewise.
const SEGMENTS_PER_KEY: usize = 32;

/// A record's text field (the spec admits only text fields as labels).
fn text<'r>(record: &'r Record<'_>, field: RecordField) -> &'r str {
    match record.get(field) {
        Some(FieldValue::Text(value)) => value,
        _ => "",
    }
}

/// `Fields.__call__` for one label: the field, or `Either`'s `first or fallback`.
fn label<'r>(record: &'r Record<'_>, source: &LabelSource) -> &'r str {
    match *source {
        LabelSource::Field(field) => text(record, field),
        LabelSource::Either(first, fallback) => {
            let value = text(record, first);
            if value.is_empty() {
                text(record, fallback)
            } else {
                value
            }
        }
    }
}

/// A record's label key: its labels, then its dimensions (`labels(record) + dimensions`).
fn key_values<'r>(record: &'r Record<'_>, labels: &'r [LabelSource]) -> impl Iterator<Item = &'r str> {
    labels.iter().map(move |source| label(record, source)).chain(record.dimensions.iter().map(|d| d.as_ref()))
}

/// `recorder._too_long`: the label id of the first value longer than `limit` bytes (UTF-8).
fn too_long<'k>(key: impl Iterator<Item = &'k str>, ids: &[u16], dimension: u16, limit: usize) -> Option<u16> {
    key.enumerate().find(|(_, value)| value.len() > limit).map(|(position, _)| ids.get(position).copied().unwrap_or(dimension))
}

/// Label-key cache entries, bounded: a new key past `limit` entries clears them all first.
struct KeyCache<E> {
    state: foldhash::fast::RandomState,
    table: HashTable<(u64, u32)>,
    entries: Vec<(KeyText, E)>,
    limit: usize,
    // The key being looked up.
    scratch: KeyScratch,
}

impl<E> KeyCache<E> {
    fn new(limit: usize) -> KeyCache<E> {
        KeyCache { state: Default::default(), table: HashTable::new(), entries: Vec::new(), limit, scratch: KeyScratch::default() }
    }

    /// The entry of `key` (gathered in `scratch`), or `Err(hash)` to insert it with.
    fn find<'k>(&mut self, key: impl Iterator<Item = &'k str>) -> Result<u32, u64> {
        self.scratch.fill(key);
        let hash = self.scratch.hash(&self.state);
        let (entries, scratch) = (&self.entries, &self.scratch);
        match self.table.find(hash, |&(h, at)| h == hash && scratch.is(&entries[at as usize].0)) {
            Some(&(_, at)) => Ok(at),
            None => Err(hash),
        }
    }

    /// Adds the key `find` did not find.
    fn insert(&mut self, hash: u64, entry: E) -> u32 {
        if self.entries.len() >= self.limit {
            self.entries.clear();
            self.table.clear();
        }
        let at = self.entries.len() as u32;
        self.entries.push((self.scratch.to_key(), entry));
        self.table.insert_unique(hash, (hash, at), |&(h, _)| h);
        at
    }
}

/// A by-outcome counter's series per outcome of one label key, or a counter's one series.
enum CounterSlot {
    Unresolved,
    One(CounterTarget),
    ByOutcome(Vec<(Box<str>, CounterTarget)>),
}

/// `_Plan.cache`'s value: per histogram step the series it observes into (and whether that is the
/// overflow series), per counter step its series, and the label too long for a series of its own.
struct Slots {
    hists: Vec<Option<(u32, bool)>>,
    counters: Vec<CounterSlot>,
    too_long: Option<u16>,
}

/// Namings of one side that build the same label key (`recorder._Plan`).
pub(crate) struct Group {
    labels: Vec<LabelSource>,
    // Too-long label ids per key position (the naming's labels, then the dimensions).
    too_long_ids: Vec<u16>,
    // The family of each histogram step, in step order (a too-long key resolves them all at once).
    hist_families: Vec<usize>,
    by_outcome: Vec<bool>,
    cache: KeyCache<Slots>,
}

/// What a spec's step does with its value: a histogram observes it (only for a successful
/// request, or once per value of a sequence field instead), a counter adds it (by outcome).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum StepKind {
    Histogram { success_only: bool, per_step: Option<RecordField> },
    Counter { by_outcome: bool },
}

/// One spec's step (`_native_ops`' "hist" and "counter" tuples).
pub(crate) struct Observe {
    group: usize,
    // Its place among its group's steps of its kind (in the cache entry's slots).
    slot: usize,
    family: usize,
    value: ValueSpec,
    // The fixed label's value, appended to the key.
    suffix: Option<String>,
    kind: StepKind,
}

pub(crate) enum Step {
    Key(usize),
    Observe(Observe),
}

/// One side's recording loop (`_compile`'s observer).
pub(crate) struct SidePlan {
    steps: Vec<Step>,
    groups: Vec<Group>,
    // The cache entry each group's key resolved to for the record being recorded.
    current: Vec<u32>,
}

/// A naming as the plan builder sees it.
pub(crate) struct PlanNaming<'s> {
    pub label_names: Vec<String>, // the naming's, then the dimensions' (OTel names)
    pub labels: &'s [LabelSource],
    pub too_long_ids: Vec<u16>,
    /// Its histograms', then its counters'.
    pub steps: Vec<PlanStep<'s>>,
}

pub(crate) struct PlanStep<'s> {
    pub family: usize,
    pub value: &'s ValueSpec,
    pub suffix: Option<&'s str>,
    pub kind: StepKind,
}

impl SidePlan {
    /// `_compile` and `_native_ops`: a naming joins the first group whose first naming has the
    /// same label names and sources (`_same_labels`); steps in naming order, a group's key step
    /// before its first naming's steps.
    pub(crate) fn new(namings: &[PlanNaming<'_>], cache_limit: usize) -> SidePlan {
        let mut groups: Vec<Group> = Vec::new();
        let mut firsts: Vec<usize> = Vec::new();
        let mut steps = Vec::new();
        for (number, naming) in namings.iter().enumerate() {
            let found = firsts.iter().position(|&first| {
                namings[first].label_names == naming.label_names && namings[first].labels == naming.labels
            });
            let group = match found {
                Some(group) => group,
                None => {
                    firsts.push(number);
                    groups.push(Group {
                        labels: naming.labels.to_vec(),
                        too_long_ids: naming.too_long_ids.clone(),
                        hist_families: Vec::new(),
                        by_outcome: Vec::new(),
                        cache: KeyCache::new(cache_limit),
                    });
                    steps.push(Step::Key(groups.len() - 1));
                    groups.len() - 1
                }
            };
            for step in &naming.steps {
                let members = &mut groups[group];
                let slot = match step.kind {
                    StepKind::Histogram { .. } => {
                        members.hist_families.push(step.family);
                        members.hist_families.len() - 1
                    }
                    StepKind::Counter { by_outcome } => {
                        members.by_outcome.push(by_outcome);
                        members.by_outcome.len() - 1
                    }
                };
                steps.push(Step::Observe(Observe {
                    group,
                    slot,
                    family: step.family,
                    value: step.value.clone(),
                    suffix: step.suffix.map(str::to_string),
                    kind: step.kind,
                }));
            }
        }
        let current = vec![0; groups.len()];
        SidePlan { steps, groups, current }
    }
}

/// What recording needs besides the plan (disjoint parts of `Series`).
pub(crate) struct Sink<'a> {
    pub hists: &'a mut [HistogramFamily],
    pub counters: &'a mut [CounterFamily],
    pub budget: &'a mut SeriesBudget,
    pub max_label_value_bytes: usize,
    pub dimension_too_long: u16,
    pub not_a_number: &'a mut u64,
}

/// One observation into the series a step's slot names (resolved on first use, as `_resolve`).
#[inline]
fn observe_hist(sink: &mut Sink<'_>, slot: &mut Option<(u32, bool)>, key: &KeyText, step: &Observe, value: Num,
                weight: f64, exemplar: Option<&Exemplar>) {
    let (at, overflowing) = match *slot {
        Some(resolved) => resolved,
        None => {
            let values: Vec<&str> = key.values().chain(step.suffix.as_deref()).collect();
            let resolved = sink.hists[step.family].series_of(&values, sink.budget);
            *slot = Some(resolved);
            resolved
        }
    };
    let histogram = &mut sink.hists[step.family];
    let bucket = bisect_left(histogram.bounds_of(&histogram.family.series[at as usize]), |bound| value.is_above(bound));
    histogram.family.series[at as usize].observe(bucket, value.as_f64(), weight, exemplar);
    if overflowing {
        histogram.family.overflowed += 1;
    }
}

fn add_counter(sink: &mut Sink<'_>, slots: &mut Slots, key: &KeyText, step: &Observe, outcome: &str, amount: f64) {
    let family = &mut sink.counters[step.family];
    if slots.too_long.is_some() {
        family.add_overflow(amount);
        return;
    }
    let resolve = |family: &mut CounterFamily, budget: &mut SeriesBudget, with_outcome: bool| {
        let values: Vec<&str> =
            key.values().chain(step.suffix.as_deref()).chain(with_outcome.then_some(outcome)).collect();
        family.target(&values, budget)
    };
    match &mut slots.counters[step.slot] {
        CounterSlot::One(target) => family.add_to(*target, amount),
        CounterSlot::ByOutcome(known) => match known.iter().find(|(o, _)| &**o == outcome) {
            Some((_, target)) => family.add_to(*target, amount),
            None => {
                // `target` counts this addition where it overflows.
                let target = resolve(family, sink.budget, true);
                family.family.series[target.at as usize].value += amount;
                if known.len() < OUTCOMES_PER_KEY {
                    known.push((outcome.into(), target));
                }
            }
        },
        slot @ CounterSlot::Unresolved => {
            let target = resolve(family, sink.budget, false);
            family.family.series[target.at as usize].value += amount;
            *slot = CounterSlot::One(target);
        }
    }
}

impl SidePlan {
    /// The observer: records `record` in every naming of this side; the first label too long
    /// for a series of its own, if any.
    pub(crate) fn record(&mut self, sink: &mut Sink<'_>, record: &Record<'_>, exemplar: Option<&Exemplar>) -> Option<u16> {
        let weight = record.weight;
        let succeeded = record.succeeded();
        let mut first_too_long = None;
        for step in &self.steps {
            match step {
                Step::Key(g) => {
                    let at = self.groups[*g].resolve_key(sink, record);
                    self.current[*g] = at;
                    if let Some(label) = self.groups[*g].cache.entries[at as usize].1.too_long {
                        first_too_long = first_too_long.or(Some(label));
                    }
                }
                Step::Observe(step) => {
                    let value = match step.kind {
                        StepKind::Histogram { success_only: true, .. } if !succeeded => continue,
                        StepKind::Histogram { per_step: Some(field), .. } => {
                            let (key, slots) = &mut self.groups[step.group].cache.entries[self.current[step.group] as usize];
                            match record.get(field) {
                                Some(FieldValue::Floats(values)) => {
                                    for &value in values {
                                        observe_hist(sink, &mut slots.hists[step.slot], key, step, Num::Float(value), weight,
                                                     exemplar);
                                    }
                                }
                                _ => *sink.not_a_number += 1,
                            }
                            continue;
                        }
                        _ => match evaluate(&step.value, record) {
                            Eval::Value(value) => value,
                            Eval::Nothing => continue,
                            Eval::NotANumber => {
                                *sink.not_a_number += 1;
                                continue;
                            }
                        },
                    };
                    let (key, slots) = &mut self.groups[step.group].cache.entries[self.current[step.group] as usize];
                    match step.kind {
                        StepKind::Histogram { .. } => {
                            observe_hist(sink, &mut slots.hists[step.slot], key, step, value, weight, exemplar)
                        }
                        StepKind::Counter { by_outcome } => {
                            let outcome: &str = if by_outcome { &record.outcome } else { "" };
                            add_counter(sink, slots, key, step, outcome, value.as_f64() * weight);
                        }
                    }
                }
            }
        }
        first_too_long
    }
}

impl Group {
    /// The cache entry of `record`'s label key (`slots = cache.get(key)`, else `new_slots`).
    fn resolve_key(&mut self, sink: &mut Sink<'_>, record: &Record<'_>) -> u32 {
        let hash = match self.cache.find(key_values(record, &self.labels)) {
            Ok(at) => return at,
            Err(hash) => hash,
        };
        // `_slots`: a too-long value resolves every histogram step to its overflow series at once.
        let too_long =
            too_long(self.cache.scratch.values(), &self.too_long_ids, sink.dimension_too_long, sink.max_label_value_bytes);
        let hists = match too_long {
            Some(_) => self.hist_families.iter().map(|&family| Some((sink.hists[family].overflow_series(), true))).collect(),
            None => vec![None; self.hist_families.len()],
        };
        let counters = self
            .by_outcome
            .iter()
            .map(|&by_outcome| if by_outcome { CounterSlot::ByOutcome(Vec::new()) } else { CounterSlot::Unresolved })
            .collect();
        self.cache.insert(hash, Slots { hists, counters, too_long })
    }
}

/// The segments family's label-key cache (`_segment_cache`): per (model, engine kind, service,
/// dimensions), the series of each segment name, or the overflow series for all of them.
pub(crate) struct SegmentCache {
    cache: KeyCache<SegmentSlots>,
    too_long_ids: Vec<u16>,
}

struct SegmentSlots {
    // `by_name[""]`: the series every segment of the key observes into, whether it is the overflow
    // series, and the too-long label counted per record. A key with a label too long for a series
    // of its own has it from the start; Python's `_resolve_segment` also stores a segment named ""
    // there, which then takes every later record's segments of the key (counted as "dimension").
    everything: Option<(u32, bool, u16)>,
    by_name: Vec<(Box<str>, u32, bool)>,
}

impl SegmentCache {
    pub(crate) fn new(limit: usize, too_long_ids: Vec<u16>) -> SegmentCache {
        SegmentCache { cache: KeyCache::new(limit), too_long_ids }
    }

    /// The segments part of `MetricsRecorder.record`: each segment's duration into its series; the
    /// too-long label of the key, if any.
    pub(crate) fn record(&mut self, sink: &mut Sink<'_>, family: usize, record: &Record<'_>,
                         exemplar: Option<&Exemplar>) -> Option<u16> {
        let base = [text(record, RecordField::Model), text(record, RecordField::EngineKind), text(record, RecordField::ServiceName)];
        let key = base.iter().copied().chain(record.dimensions.iter().map(|d| d.as_ref()));
        let at = match self.cache.find(key) {
            Ok(at) => at,
            Err(hash) => {
                // `_segment_entry`
                let label = too_long(self.cache.scratch.values(), &self.too_long_ids, sink.dimension_too_long,
                                     sink.max_label_value_bytes);
                let everything = label.map(|label| (sink.hists[family].overflow_series(), true, label));
                self.cache.insert(hash, SegmentSlots { everything, by_name: Vec::new() })
            }
        };
        let slots = &mut self.cache.entries[at as usize].1;
        // Read once, before the segments: one resolved in this record applies from the next.
        let everything = slots.everything;
        let weight = record.weight;
        for segment in &record.segments {
            // `(end - start) / 1e9` on Python ints: exact difference, one rounding to float (an
            // i64's conversion rounds as an i128's, in one instruction).
            let duration = match segment.end_unix_ns.checked_sub(segment.start_unix_ns) {
                Some(difference) => difference as f64,
                None => (i128::from(segment.end_unix_ns) - i128::from(segment.start_unix_ns)) as f64,
            } / 1e9;
            let known = match everything {
                Some((at, overflowing, _)) => Some((at, overflowing)),
                None => match &slots.everything {
                    Some((at, overflowing, _)) if segment.name.is_empty() => Some((*at, *overflowing)),
                    _ => slots.by_name.iter().find(|(name, _, _)| **name == *segment.name).map(|&(_, at, o)| (at, o)),
                },
            };
            let (at, overflowing) = match known {
                Some(known) => known,
                None => {
                    // `_resolve_segment`
                    let values: Vec<&str> = base
                        .iter()
                        .copied()
                        .chain(std::iter::once(segment.name.as_ref()))
                        .chain(record.dimensions.iter().map(|d| d.as_ref()))
                        .collect();
                    let (at, overflowing) = sink.hists[family].series_of(&values, sink.budget);
                    if segment.name.is_empty() {
                        slots.everything = Some((at, overflowing, sink.dimension_too_long));
                    } else if slots.by_name.len() < SEGMENTS_PER_KEY {
                        slots.by_name.push((segment.name.as_ref().into(), at, overflowing));
                    }
                    (at, overflowing)
                }
            };
            let histogram = &mut sink.hists[family];
            let bucket = bisect_left(histogram.bounds_of(&histogram.family.series[at as usize]), |bound| bound < duration);
            histogram.family.series[at as usize].observe(bucket, duration, weight, exemplar);
            if overflowing {
                histogram.family.overflowed += 1;
            }
        }
        everything.map(|(_, _, label)| label)
    }
}

/// The side a record's namings observe it in.
pub(crate) fn side_index(side: Side) -> usize {
    match side {
        Side::Server => 0,
        Side::Client => 1,
    }
}
