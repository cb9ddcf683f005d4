//! Label-keyed histogram and counter series (`llm_metrics/metrics/families.py`): each family caps
//! its series at `limit` label sets (the overflow series counts among them, as `len(series)`
//! does) and by the byte budget every family of a recorder shares (`SeriesBudget`); past either,
//! new label sets observe into one overflow series. Series keep their creation order, the order
//! Python's dicts expose them in.

use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;

use super::exponential::ExponentialState;
use super::spec::ExponentialLimits;

/// `Family.OVERFLOW`'s one label value: a key equal to it is the overflow series' own key.
pub const OVERFLOW_KEY: &str = "__overflow__";

/// `families.SeriesBudget`: bytes of exposition the series of every family together may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeriesBudget {
    pub limit: u64,
    pub used: u64,
}

impl SeriesBudget {
    pub fn new(limit: u64) -> SeriesBudget {
        SeriesBudget { limit, used: 0 }
    }

    /// `SeriesBudget.take`.
    pub fn take(&mut self, cost: u64) -> bool {
        match self.used.checked_add(cost) {
            Some(total) if total <= self.limit => {
                self.used = total;
                true
            }
            _ => false,
        }
    }
}

// families.py's estimate of a series' exposition (it errs high).
const LINE_OVERHEAD: u64 = 16 + 8 + 30; // a name's suffix and translation, le="...", the value and separators
const EXEMPLAR: u64 = 110; // OpenMetrics: ' # {trace_id="<32>",span_id="<16>"} <value> <timestamp>'

/// What a new series of one family costs the budget (`Family.__init__`'s `_lines`, `_line_bytes`
/// and `_label_names_bytes`; lengths of names in characters, as Python's `len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeriesCost {
    lines: u64,
    line_bytes: u64,
    label_names_bytes: u64,
}

impl SeriesCost {
    pub fn new<S: AsRef<str>>(name: &str, lines: usize, exemplars: bool, label_names: &[S]) -> SeriesCost {
        SeriesCost {
            lines: lines as u64,
            line_bytes: name.chars().count() as u64 + LINE_OVERHEAD + if exemplars { EXEMPLAR } else { 0 },
            label_names_bytes: label_names.iter().map(|n| n.as_ref().chars().count() as u64 + 4).sum(),
        }
    }

    /// `has_room`'s cost of a series with these label values (as exposed: UTF-8, with `\\`, `"`
    /// and newlines escaped).
    pub fn of<'k>(&self, key: impl Iterator<Item = &'k str>) -> u64 {
        let mut label_bytes = self.label_names_bytes;
        for value in key {
            let escaped = value.bytes().filter(|b| matches!(b, b'\\' | b'"' | b'\n')).count();
            label_bytes = label_bytes.saturating_add((value.len() + escaped) as u64);
        }
        self.lines.saturating_mul(self.line_bytes.saturating_add(label_bytes))
    }
}

/// A series' label values, held as one text (one allocation per series, not one per value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyText {
    text: Box<str>,
    ends: Box<[u32]>,
}

impl KeyText {
    pub fn new<'k>(values: impl Iterator<Item = &'k str>) -> KeyText {
        let mut text = String::new();
        let mut ends = Vec::new();
        for value in values {
            text.push_str(value);
            ends.push(text.len() as u32);
        }
        KeyText { text: text.into_boxed_str(), ends: ends.into_boxed_slice() }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, position: usize) -> &str {
        let start = if position == 0 { 0 } else { self.ends[position - 1] as usize };
        &self.text[start..self.ends[position] as usize]
    }

    pub fn values(&self) -> impl Iterator<Item = &str> + Clone + '_ {
        split(&self.text, &self.ends)
    }

    /// Whether the key is `values`, value by value.
    pub fn equals<'k>(&self, values: impl Iterator<Item = &'k str>) -> bool {
        let mut position = 0;
        for value in values {
            if position >= self.len() || self.get(position) != value {
                return false;
            }
            position += 1;
        }
        position == self.len()
    }
}

/// A record's label key gathered for a cache lookup, in `KeyText`'s layout (reused: no allocation
/// once grown): hashed in one pass over its text and its ends, compared with two slice comparisons.
#[derive(Default)]
pub(crate) struct KeyScratch {
    text: String,
    ends: Vec<u32>,
}

impl KeyScratch {
    pub(crate) fn fill<'k>(&mut self, values: impl Iterator<Item = &'k str>) {
        self.text.clear();
        self.ends.clear();
        for value in values {
            self.text.push_str(value);
            self.ends.push(self.text.len() as u32);
        }
    }

    /// The key's hash (its ends included, so ("ab", "") and ("a", "b") differ).
    pub(crate) fn hash(&self, state: &foldhash::fast::RandomState) -> u64 {
        let mut hasher = state.build_hasher();
        hasher.write(self.text.as_bytes());
        for &end in &self.ends {
            hasher.write_u32(end);
        }
        hasher.finish()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &str> + Clone + '_ {
        split(&self.text, &self.ends)
    }

    pub(crate) fn to_key(&self) -> KeyText {
        KeyText { text: self.text.as_str().into(), ends: self.ends.as_slice().into() }
    }

    pub(crate) fn is(&self, key: &KeyText) -> bool {
        *key.text == *self.text && *key.ends == *self.ends
    }
}

/// Values held as one text and the end of each.
fn split<'a>(text: &'a str, ends: &'a [u32]) -> impl Iterator<Item = &'a str> + Clone + 'a {
    ends.iter().scan(0usize, move |start, &end| {
        let value = text.get(*start..end as usize).unwrap_or("");
        *start = end as usize;
        Some(value)
    })
}

/// A key's hash, value by value (lengths included, so ("ab", "") and ("a", "b") differ).
pub(crate) fn hash_key<'k>(state: &foldhash::fast::RandomState, values: impl Iterator<Item = &'k str>) -> u64 {
    let mut hasher = state.build_hasher();
    for value in values {
        hasher.write_usize(value.len());
        hasher.write(value.as_bytes());
    }
    hasher.finish()
}

/// Series positions by key, without a `String` per lookup.
#[derive(Clone, Default)]
struct KeyIndex {
    state: foldhash::fast::RandomState,
    table: HashTable<(u64, u32)>,
}

impl KeyIndex {
    fn find<'k, F>(&self, values: &[&'k str], key_of: F) -> Option<u32>
    where
        F: Fn(u32) -> Option<&'k KeyText>,
    {
        let hash = hash_key(&self.state, values.iter().copied());
        self.table
            .find(hash, |&(h, at)| h == hash && key_of(at).is_some_and(|key| key.equals(values.iter().copied())))
            .map(|&(_, at)| at)
    }

    fn insert(&mut self, values: &[&str], at: u32) {
        let hash = hash_key(&self.state, values.iter().copied());
        self.table.insert_unique(hash, (hash, at), |&(h, _)| h);
    }
}

fn is_overflow_key(values: &[&str]) -> bool {
    values.len() == 1 && values[0] == OVERFLOW_KEY
}

/// The latest observation of a bucket from a kept trace (`families.Exemplar`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exemplar {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub value: f64,
    /// Unix seconds, when it was recorded.
    pub timestamp: f64,
}

/// `families.HistogramSeries`.
#[derive(Clone, Debug)]
pub struct HistogramSeries {
    /// `None`: the overflow series.
    pub(crate) key: Option<KeyText>,
    /// Per bucket, not cumulative; the last is +Inf.
    pub(crate) counts: Vec<f64>,
    pub(crate) total: f64,
    pub(crate) count: f64,
    /// Per bucket, the latest exemplar (empty until the first).
    pub(crate) exemplars: Vec<Option<Exemplar>>,
    /// Its own bounds (a model's), as an index into the family's per-model bounds.
    pub(crate) own_bounds: Option<u32>,
    pub(crate) exponential: Option<Box<ExponentialState>>,
}

impl HistogramSeries {
    /// Adds one observation (`bucket` from `bisect_left` of its bounds): the generated observer's
    /// `counts[index] += weight`, `total += value * weight`, `count += weight`, the exponential
    /// state and the exemplar.
    #[inline]
    pub(crate) fn observe(&mut self, bucket: usize, value: f64, weight: f64, exemplar: Option<&Exemplar>) {
        self.counts[bucket] += weight;
        self.total += value * weight;
        self.count += weight;
        if let Some(state) = self.exponential.as_deref_mut() {
            state.observe(value, weight);
        }
        if let Some(exemplar) = exemplar {
            if self.exemplars.is_empty() {
                self.exemplars.resize(self.counts.len(), None);
            }
            self.exemplars[bucket] = Some(Exemplar { value, ..*exemplar });
        }
    }
}

/// `bisect_left(bounds, value)` with Python's comparisons (`bound < value`): `value == bound`
/// falls in that bound's bucket, NaN in the first.
#[inline]
pub(crate) fn bisect_left(bounds: &[f64], above: impl Fn(f64) -> bool) -> usize {
    let (mut low, mut high) = (0usize, bounds.len());
    while low < high {
        let middle = (low + high) / 2;
        if above(bounds[middle]) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    low
}

/// What both kinds of family are (`families.Family`): series by key in creation order, capped at
/// `limit` (the overflow series counts among them, as `len(series)` does) and by the byte budget.
#[derive(Clone)]
pub(crate) struct Family<S> {
    pub(crate) name: String,
    limit: usize,
    cost: SeriesCost,
    pub(crate) series: Vec<S>,
    index: KeyIndex,
    overflow: Option<u32>,
    pub(crate) overflowed: u64,
}

/// A series' key (`None`: the overflow series).
pub(crate) trait Keyed {
    fn key(&self) -> Option<&KeyText>;
}

impl Keyed for HistogramSeries {
    fn key(&self) -> Option<&KeyText> {
        self.key.as_ref()
    }
}

impl Keyed for CounterSeries {
    fn key(&self) -> Option<&KeyText> {
        self.key.as_ref()
    }
}

impl<S: Keyed> Family<S> {
    fn new(name: &str, limit: usize, cost: SeriesCost) -> Family<S> {
        Family {
            name: name.to_string(),
            limit,
            cost,
            series: Vec::new(),
            index: KeyIndex::default(),
            overflow: None,
            overflowed: 0,
        }
    }

    fn find(&self, key: &[&str]) -> Option<u32> {
        let series = &self.series;
        self.index.find(key, |at| series[at as usize].key())
    }

    /// `Family.has_room`: under the cap, and the budget takes the series' cost.
    fn has_room(&self, key: &[&str], budget: &mut SeriesBudget) -> bool {
        self.series.len() < self.limit && budget.take(self.cost.of(key.iter().copied()))
    }

    /// A new series of `key` (or the overflow series), made by `make`.
    fn add(&mut self, key: Option<&[&str]>, make: impl FnOnce(Option<KeyText>) -> S) -> u32 {
        let at = self.series.len() as u32;
        match key {
            Some(key) => {
                self.series.push(make(Some(KeyText::new(key.iter().copied()))));
                self.index.insert(key, at);
            }
            None => {
                self.series.push(make(None));
                self.overflow = Some(at);
            }
        }
        at
    }

    /// The overflow series, made by `make` if it is not yet (it takes nothing from the budget).
    fn overflow_series(&mut self, make: impl FnOnce(Option<KeyText>) -> S) -> u32 {
        match self.overflow {
            Some(at) => at,
            None => self.add(None, make),
        }
    }
}

/// `families.HistogramFamily`.
#[derive(Clone)]
pub struct HistogramFamily {
    pub(crate) family: Family<HistogramSeries>,
    pub(crate) bounds: Vec<f64>,
    // `dict(buckets_by_model)`: model -> position in `by_model` (the last declaration of a model wins).
    by_model_index: std::collections::HashMap<String, u32>,
    pub(crate) by_model: Vec<Vec<f64>>,
    exponential: Option<ExponentialLimits>,
}

impl HistogramFamily {
    /// `HistogramFamily(name, bounds, limit, budget, label_names, bounds_by_model)`: a bucket line
    /// per bound and +Inf, then `_count` and `_sum`, each with room for an exemplar.
    pub fn new<S: AsRef<str>>(name: &str, bounds: Vec<f64>, limit: usize, label_names: &[S],
                              bounds_by_model: &[(String, Vec<f64>)]) -> HistogramFamily {
        let mut by_model_index = std::collections::HashMap::new();
        let mut by_model = Vec::new();
        for (model, model_bounds) in bounds_by_model {
            by_model_index.insert(model.clone(), by_model.len() as u32);
            by_model.push(model_bounds.clone());
        }
        HistogramFamily {
            family: Family::new(name, limit, SeriesCost::new(name, bounds.len() + 3, true, label_names)),
            bounds,
            by_model_index,
            by_model,
            exponential: None,
        }
    }

    pub(crate) fn has_series(&self) -> bool {
        !self.family.series.is_empty()
    }

    pub(crate) fn set_exponential(&mut self, limits: Option<ExponentialLimits>) {
        self.exponential = limits;
    }

    /// The bounds a series observes with: its model's, or the family's.
    #[inline]
    pub(crate) fn bounds_of(&self, series: &HistogramSeries) -> &[f64] {
        match series.own_bounds {
            Some(at) => &self.by_model[at as usize],
            None => &self.bounds,
        }
    }

    /// `HistogramFamily.new_series`, as a maker for `Family` (of the family's parts, so the
    /// family's series can be borrowed beside it): its model's bounds where the family has some
    /// for the key's first value (the overflow series' is `__overflow__`), and exponential buckets
    /// if asked for.
    fn maker_of<'a>(bounds: &'a [f64], by_model_index: &'a std::collections::HashMap<String, u32>,
                    by_model: &'a [Vec<f64>], exponential: Option<ExponentialLimits>)
                    -> impl FnOnce(Option<KeyText>) -> HistogramSeries + 'a {
        move |key| {
            let first = key.as_ref().map_or(Some(OVERFLOW_KEY), |k| if k.is_empty() { None } else { Some(k.get(0)) });
            let own_bounds = first
                .and_then(|model| by_model_index.get(model))
                .copied()
                .filter(|&at| !by_model[at as usize].is_empty());
            let buckets = own_bounds.map_or(bounds.len(), |at| by_model[at as usize].len()) + 1;
            HistogramSeries {
                key,
                counts: vec![0.0; buckets],
                total: 0.0,
                count: 0.0,
                exemplars: Vec::new(),
                own_bounds,
                exponential: exponential.map(|l| Box::new(ExponentialState::new(l.max_size, l.max_scale))),
            }
        }
    }

    /// The overflow series, made if it is not yet.
    pub(crate) fn overflow_series(&mut self) -> u32 {
        let HistogramFamily { family, bounds, by_model_index, by_model, exponential } = self;
        let maker = HistogramFamily::maker_of(bounds, by_model_index, by_model, *exponential);
        family.overflow_series(maker)
    }

    /// `recorder._series_of` and `_resolve`'s test: the series `key` observes into, and whether
    /// that is the overflow series (each observation there counts in `overflowed`).
    pub(crate) fn series_of(&mut self, key: &[&str], budget: &mut SeriesBudget) -> (u32, bool) {
        if is_overflow_key(key) {
            return (self.overflow_series(), true);
        }
        if let Some(at) = self.family.find(key) {
            return (at, false);
        }
        if !self.family.has_room(key, budget) {
            return (self.overflow_series(), true);
        }
        let HistogramFamily { family, bounds, by_model_index, by_model, exponential } = self;
        (family.add(Some(key), HistogramFamily::maker_of(bounds, by_model_index, by_model, *exponential)), false)
    }
}

/// One counter series.
#[derive(Clone, Debug)]
pub struct CounterSeries {
    /// `None`: the overflow series.
    pub(crate) key: Option<KeyText>,
    pub(crate) value: f64,
}

fn counter_series(key: Option<KeyText>) -> CounterSeries {
    CounterSeries { key, value: 0.0 }
}

/// `families.CounterFamily`: a total per label set. Also what the accounting families are made
/// of (they share the recorder's budget: pass `Series::budget_mut`).
#[derive(Clone)]
pub struct CounterFamily {
    pub(crate) family: Family<CounterSeries>,
}

/// Where a counter key's amounts go: a series, and whether each addition counts in `overflowed`
/// (a key the family had no room for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CounterTarget {
    pub(crate) at: u32,
    pub(crate) overflowing: bool,
}

impl CounterFamily {
    /// `CounterFamily(name, limit, budget, label_names)`: one sample line per series, no exemplar.
    pub fn new<S: AsRef<str>>(name: &str, limit: usize, label_names: &[S]) -> CounterFamily {
        CounterFamily { family: Family::new(name, limit, SeriesCost::new(name, 1, false, label_names)) }
    }

    pub fn name(&self) -> &str {
        &self.family.name
    }

    /// Observations sent to the overflow series.
    pub fn overflowed(&self) -> u64 {
        self.family.overflowed
    }

    pub fn is_empty(&self) -> bool {
        self.family.series.is_empty()
    }

    /// (key, total) in creation order; `None`: the overflow series (`CounterFamily.totals`).
    pub fn totals(&self) -> impl Iterator<Item = (Option<&KeyText>, f64)> + '_ {
        self.family.series.iter().map(|s| (s.key.as_ref(), s.value))
    }

    /// `CounterFamily.add`'s choice of series for `key` (counting this addition in `overflowed`
    /// where the family has no room for it). A key equal to `OVERFLOW` is a key like any other
    /// for the cap and budget, but names the overflow series.
    pub(crate) fn target(&mut self, key: &[&str], budget: &mut SeriesBudget) -> CounterTarget {
        let family = &mut self.family;
        let literal_overflow = is_overflow_key(key);
        let found = if literal_overflow { family.overflow } else { family.find(key) };
        if let Some(at) = found {
            return CounterTarget { at, overflowing: false };
        }
        if !family.has_room(key, budget) {
            family.overflowed += 1;
            // `_admit` counted this addition; a literal overflow key finds its series next time.
            return CounterTarget { at: family.overflow_series(counter_series), overflowing: !literal_overflow };
        }
        let at = if literal_overflow { family.overflow_series(counter_series) } else { family.add(Some(key), counter_series) };
        CounterTarget { at, overflowing: false }
    }

    /// Adds `amount` where `target` says (an overflowing key counts again, as each `add` did).
    #[inline]
    pub(crate) fn add_to(&mut self, target: CounterTarget, amount: f64) {
        if target.overflowing {
            self.family.overflowed += 1;
        }
        self.family.series[target.at as usize].value += amount;
    }

    /// `CounterFamily.add`.
    pub fn add(&mut self, key: &[&str], amount: f64, budget: &mut SeriesBudget) {
        let target = self.target(key, budget);
        // `target` counted this addition already.
        self.family.series[target.at as usize].value += amount;
    }

    /// `CounterFamily.add_overflow`: `amount` on the overflow series (a label value too long for
    /// a series of its own), counted.
    pub fn add_overflow(&mut self, amount: f64) {
        self.family.overflowed += 1;
        let at = self.family.overflow_series(counter_series);
        self.family.series[at as usize].value += amount;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_takes_a_cost_only_whole() {
        let mut budget = SeriesBudget::new(100);
        assert!(budget.take(60));
        assert!(!budget.take(41));
        assert_eq!(budget.used, 60);
        assert!(budget.take(40));
        assert!(!budget.take(1));
        assert!(!budget.take(u64::MAX));
    }

    #[test]
    fn a_series_costs_its_lines_times_names_values_and_overhead() {
        // families.py: lines * (len(name) + 54 [+ 110] + sum(len(label) + 4) + value bytes + escapes)
        let cost = SeriesCost::new("vllm:x", 1, false, &["model_name", "finished_reason"]);
        assert_eq!(cost.of(["m", "stop"].into_iter()), 6 + 54 + (10 + 4) + (15 + 4) + 1 + 4);
        let histogram = SeriesCost::new("h", 5, true, &["a", "le"]);
        assert_eq!(histogram.of(["q\"\\\n"].into_iter()), 5 * (1 + 54 + 110 + 5 + 6 + 4 + 3));
        // Characters in names, UTF-8 bytes in values.
        assert_eq!(SeriesCost::new("é", 1, false, &["ü"]).of(["é"].into_iter()), 1 + 54 + 5 + 2);
    }

    #[test]
    fn key_text_holds_values_apart() {
        let key = KeyText::new(["ab", "", "c"].into_iter());
        assert_eq!(key.len(), 3);
        assert_eq!(key.values().collect::<Vec<_>>(), vec!["ab", "", "c"]);
        assert!(key.equals(["ab", "", "c"].into_iter()));
        assert!(!key.equals(["a", "b", "c"].into_iter()));
        assert!(!key.equals(["ab", ""].into_iter()));
        assert!(!key.equals(["ab", "", "c", ""].into_iter()));
        let state = foldhash::fast::RandomState::default();
        assert_ne!(hash_key(&state, ["ab", ""].into_iter()), hash_key(&state, ["a", "b"].into_iter()));
    }

    #[test]
    fn bisect_left_puts_a_bound_in_its_own_bucket() {
        let bounds = [0.1, 0.5, 1.0];
        let at = |v: f64| bisect_left(&bounds, |b| b < v);
        assert_eq!(at(0.1), 0);
        assert_eq!(at(0.10000000000000002), 1);
        assert_eq!(at(1.0), 2);
        assert_eq!(at(1.5), 3);
        assert_eq!(at(-1.0), 0);
        assert_eq!(at(f64::NAN), 0);
        assert_eq!(at(f64::INFINITY), 3);
    }

    #[test]
    fn histogram_series_overflow_at_the_cap() {
        let mut budget = SeriesBudget::new(u64::MAX);
        let mut family = HistogramFamily::new("h", vec![1.0], 2, &["a", "le"], &[]);
        assert_eq!(family.series_of(&["x"], &mut budget), (0, false));
        assert_eq!(family.series_of(&["y"], &mut budget), (1, false));
        assert_eq!(family.series_of(&["x"], &mut budget), (0, false));
        assert_eq!(family.series_of(&["z"], &mut budget), (2, true));
        assert_eq!(family.series_of(&["w"], &mut budget), (2, true));
        assert!(family.family.series[2].key.is_none());
        // A literal OVERFLOW key is the overflow series, whatever the room.
        assert_eq!(family.series_of(&[OVERFLOW_KEY], &mut budget), (2, true));
    }

    #[test]
    fn histogram_series_overflow_when_the_budget_is_spent() {
        let family_cost = SeriesCost::new("h", 4, true, &["a", "le"]).of(["x"].into_iter());
        let mut budget = SeriesBudget::new(family_cost + 10);
        let mut family = HistogramFamily::new("h", vec![1.0], 100, &["a", "le"], &[]);
        assert_eq!(family.series_of(&["x"], &mut budget), (0, false));
        assert_eq!(budget.used, family_cost);
        assert_eq!(family.series_of(&["y"], &mut budget), (1, true));
        assert_eq!(budget.used, family_cost, "a series that does not fit takes nothing");
    }

    #[test]
    fn per_model_bounds_follow_the_first_label() {
        let mut budget = SeriesBudget::new(u64::MAX);
        let by_model = vec![("big".to_string(), vec![1.0, 10.0, 100.0]), ("none".to_string(), vec![])];
        let mut family = HistogramFamily::new("h", vec![1.0], 10, &["model", "le"], &by_model);
        let (big, _) = family.series_of(&["big", "x"], &mut budget);
        let (other, _) = family.series_of(&["other", "x"], &mut budget);
        let (none, _) = family.series_of(&["none", "x"], &mut budget);
        assert_eq!(family.family.series[big as usize].counts.len(), 4);
        assert_eq!(family.bounds_of(&family.family.series[big as usize]), &[1.0, 10.0, 100.0]);
        assert_eq!(family.family.series[other as usize].counts.len(), 2);
        assert_eq!(family.family.series[none as usize].counts.len(), 2, "an empty tuple of bounds is the family's");
    }

    #[test]
    fn counters_count_every_addition_past_the_cap() {
        let mut budget = SeriesBudget::new(u64::MAX);
        let mut family = CounterFamily::new("c", 1, &["a"]);
        family.add(&["x"], 1.0, &mut budget);
        family.add(&["y"], 2.0, &mut budget);
        family.add(&["y"], 3.0, &mut budget);
        family.add(&["x"], 0.5, &mut budget);
        assert_eq!(family.overflowed(), 2);
        let totals: Vec<_> = family.totals().map(|(k, v)| (k.map(|k| k.get(0).to_string()), v)).collect();
        assert_eq!(totals, vec![(Some("x".to_string()), 1.5), (None, 5.0)]);
        let target = family.target(&["z"], &mut budget);
        assert!(target.overflowing);
        assert_eq!(family.overflowed(), 3);
        family.add_to(target, 1.0);
        assert_eq!(family.overflowed(), 4);
        family.add_overflow(2.0);
        assert_eq!(family.overflowed(), 5);
        assert_eq!(family.family.series[1].value, 8.0);
    }

    #[test]
    fn a_literal_overflow_counter_key_takes_room_like_any_other() {
        // CounterFamily.add(("__overflow__",)): `_admit` asks has_room for it (budget taken), and
        // the series is the overflow series; only a key without room counts in overflowed.
        let mut budget = SeriesBudget::new(u64::MAX);
        let mut family = CounterFamily::new("c", 5, &["a"]);
        family.add(&[OVERFLOW_KEY], 1.0, &mut budget);
        assert_eq!(family.overflowed(), 0);
        assert!(budget.used > 0);
        family.add(&[OVERFLOW_KEY], 1.0, &mut budget);
        assert_eq!(family.family.series.len(), 1);
        assert_eq!(family.family.series[0].value, 2.0);
        assert!(family.family.series[0].key.is_none());
        let mut full = CounterFamily::new("c", 0, &["a"]);
        full.add(&[OVERFLOW_KEY], 1.0, &mut budget);
        full.add(&[OVERFLOW_KEY], 1.0, &mut budget);
        assert_eq!(full.overflowed(), 1, "counted when it had no room, then found as the overflow series");
    }
}
