//! Base-2 exponential histogram state (`llm_metrics/metrics/exponential.py`), one per series where
//! an exporter asked for exponential buckets: bucket `index` at `scale` holds `(base^index,
//! base^(index+1)]`, `base = 2^(2^-scale)`, with opentelemetry-sdk's value -> index mappings
//! (`LogarithmMapping` for scale > 0, `ExponentMapping` otherwise), downscaled exactly just enough
//! to keep each sign within `max_size` buckets.
//!
//! A sign's buckets keep Python's dict order (the order indexes were first counted): a downscale
//! adds merged counts in that order, and float addition is not associative (weights like 1.45).

use super::spec::MIN_SCALE;
use super::value::power_of_two;

const MANTISSA_MASK: u64 = (1 << 52) - 1;
const MIN_NORMAL_EXPONENT: i64 = -1022;
const MAX_NORMAL_EXPONENT: i64 = 1023;
/// `exponential._MAX_FAST`: 2^1000, below the top buckets `LogarithmMapping` clamps.
const MAX_FAST: f64 = 1.0715086071862673e301;
const ABSENT: u32 = u32::MAX;

fn ieee_exponent(value: f64) -> i64 {
    ((value.to_bits() >> 52) & 0x7ff) as i64 - 1023
}

fn ieee_mantissa(value: f64) -> u64 {
    value.to_bits() & MANTISSA_MASK
}

/// `ldexp(1 / log(2), scale)`: what `LogarithmMapping` multiplies `log(value)` by.
fn scale_factor(scale: i32) -> f64 {
    (1.0 / 2f64.ln()) * power_of_two(scale)
}

/// `mapping_of(scale).map_to_index(value)` for `value > 0` (opentelemetry-sdk's
/// `LogarithmMapping.map_to_index` and `ExponentMapping.map_to_index`).
fn map_to_index(value: f64, scale: i32, factor: f64) -> i64 {
    if scale > 0 {
        if value <= f64::MIN_POSITIVE {
            return (MIN_NORMAL_EXPONENT << scale) - 1;
        }
        if ieee_mantissa(value) == 0 {
            return (ieee_exponent(value) << scale) - 1;
        }
        let max_normal_lower_boundary = ((MAX_NORMAL_EXPONENT + 1) << scale) - 1;
        ((value.ln() * factor).floor() as i64).min(max_normal_lower_boundary)
    } else {
        if value < f64::MIN_POSITIVE {
            let mut index = MIN_NORMAL_EXPONENT >> -scale;
            if -scale < 2 {
                index -= 1;
            }
            return index;
        }
        let correction = if ieee_mantissa(value) == 0 { -1 } else { 0 };
        (ieee_exponent(value) + correction) >> -scale
    }
}

/// `exponential.fast_index` (the SDK mappings' own arithmetic for normal floats) with the SDK
/// mapping for anything else.
#[inline]
fn index_of(value: f64, scale: i32, factor: f64) -> i64 {
    if !(f64::MIN_POSITIVE < value && value < MAX_FAST) {
        return map_to_index(value, scale, factor);
    }
    let exponent = ieee_exponent(value); // frexp's exponent - 1
    let power_of_two = ieee_mantissa(value) == 0; // frexp's mantissa == 0.5
    if scale > 0 {
        if power_of_two {
            (exponent << scale) - 1
        } else {
            (value.ln() * factor).floor() as i64
        }
    } else {
        (exponent - i64::from(power_of_two)) >> -scale
    }
}

/// `index >> change` as Python shifts an int (floor division by 2^change, any change).
fn shifted(index: i64, change: u32) -> i64 {
    index >> change.min(63)
}

/// `exponential.change_to_fit`: the smallest downscale after which `low ..= high` takes at most
/// `max_size` buckets.
pub fn change_to_fit(low: i64, high: i64, max_size: usize) -> u32 {
    let mut change = 0u32;
    while (shifted(high, change) as i128) - (shifted(low, change) as i128) + 1 > max_size as i128 {
        change += 1;
        if change > 64 {
            break; // max_size < 2 never fits; the spec refuses it
        }
    }
    change
}

/// One sign's buckets (`exponential.ExponentialBuckets`): counts by index in the order each index
/// was first counted, and their index range.
#[derive(Clone, Debug, PartialEq)]
pub struct ExponentialBuckets {
    counts: Vec<(i64, f64)>,
    low: i64,
    high: i64,
    // Position in `counts` of each index in `low ..= high` (ABSENT: not counted), so an
    // observation finds its count without a search.
    slots: Vec<u32>,
}

impl Default for ExponentialBuckets {
    fn default() -> Self {
        ExponentialBuckets { counts: Vec::new(), low: 0, high: -1, slots: Vec::new() }
    }
}

impl ExponentialBuckets {
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// (index, count) in Python's dict order.
    pub fn entries(&self) -> &[(i64, f64)] {
        &self.counts
    }

    pub fn low(&self) -> i64 {
        self.low
    }

    pub fn high(&self) -> i64 {
        self.high
    }

    /// `ExponentialBuckets.dense`: (offset, counts from `offset` on), as OTLP and Prometheus carry them.
    pub fn dense(&self) -> (i64, Vec<f64>) {
        if self.counts.is_empty() {
            return (0, Vec::new());
        }
        let values = self.slots.iter().map(|&slot| if slot == ABSENT { 0.0 } else { self.counts[slot as usize].1 });
        (self.low, values.collect())
    }

    fn reindex(&mut self) {
        self.slots.clear();
        if self.counts.is_empty() {
            return;
        }
        let width = usize::try_from(self.high - self.low + 1).unwrap_or(0);
        self.slots.resize(width, ABSENT);
        for (position, (index, _)) in self.counts.iter().enumerate() {
            self.slots[(index - self.low) as usize] = position as u32;
        }
    }

    /// `counts[index] = counts.get(index, 0.0) + weight`, `index` within `low ..= high`.
    fn add(&mut self, index: i64, weight: f64) {
        let slot = &mut self.slots[(index - self.low) as usize];
        if *slot == ABSENT {
            *slot = self.counts.len() as u32;
            self.counts.push((index, 0.0 + weight));
        } else {
            self.counts[*slot as usize].1 += weight;
        }
    }

    /// `ExponentialBuckets.downscale`: merged in dict order (`merged.get(i, 0.0) + count`).
    fn downscale(&mut self, change: u32) {
        if change == 0 || self.counts.is_empty() {
            return;
        }
        let mut merged: Vec<(i64, f64)> = Vec::with_capacity(self.counts.len());
        for &(index, count) in &self.counts {
            let index = shifted(index, change);
            match merged.iter_mut().find(|(i, _)| *i == index) {
                Some(entry) => entry.1 += count,
                None => merged.push((index, 0.0 + count)),
            }
        }
        self.counts = merged;
        self.low = shifted(self.low, change);
        self.high = shifted(self.high, change);
        self.reindex();
    }
}

/// `exponential.ExponentialState`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExponentialState {
    pub max_size: usize,
    pub scale: i32,
    pub zero_count: f64,
    pub positive: ExponentialBuckets,
    pub negative: ExponentialBuckets,
    factor: f64,
}

impl ExponentialState {
    /// `ExponentialState(max_size, max_scale)`; the limits are checked by the spec.
    pub fn new(max_size: usize, max_scale: i32) -> ExponentialState {
        ExponentialState {
            max_size,
            scale: max_scale,
            zero_count: 0.0,
            positive: ExponentialBuckets::default(),
            negative: ExponentialBuckets::default(),
            factor: scale_factor(max_scale),
        }
    }

    /// `ExponentialState.observe`: NaN falls in the zero bucket, as Python's comparisons put it.
    pub fn observe(&mut self, value: f64, weight: f64) {
        let (negative, magnitude) = if value > 0.0 {
            (false, value)
        } else if value < 0.0 {
            (true, -value)
        } else {
            self.zero_count += weight;
            return;
        };
        let mut index = index_of(magnitude, self.scale, self.factor);
        let buckets = if negative { &self.negative } else { &self.positive };
        if buckets.counts.is_empty() {
            let buckets = if negative { &mut self.negative } else { &mut self.positive };
            buckets.low = index;
            buckets.high = index;
            buckets.slots.clear();
            buckets.slots.push(ABSENT);
        } else if index < buckets.low || index > buckets.high {
            let (low, high) = (buckets.low.min(index), buckets.high.max(index));
            if (high as i128) - (low as i128) + 1 > self.max_size as i128 {
                index = shifted(index, self.downscale(change_to_fit(low, high, self.max_size)));
            }
            let buckets = if negative { &mut self.negative } else { &mut self.positive };
            if index < buckets.low {
                buckets.low = index;
            } else if index > buckets.high {
                buckets.high = index;
            }
            buckets.reindex();
        }
        let buckets = if negative { &mut self.negative } else { &mut self.positive };
        buckets.add(index, weight);
    }

    /// `ExponentialState.downscale`: merge both signs' buckets to `scale - change` (never below
    /// `MIN_SCALE`); the change made.
    pub fn downscale(&mut self, change: u32) -> u32 {
        let change = change.min((self.scale - MIN_SCALE).max(0) as u32);
        if change > 0 {
            self.positive.downscale(change);
            self.negative.downscale(change);
            self.scale -= change as i32;
            self.factor = scale_factor(self.scale);
        }
        change
    }

    /// `ExponentialState.fitted`: a copy downscaled to `max_scale` and to `max_size` buckets per sign.
    pub fn fitted(&self, max_size: usize, max_scale: i32) -> ExponentialState {
        let mut out = self.clone();
        let mut change = (out.scale - max_scale).max(0) as u32;
        for buckets in [&out.positive, &out.negative] {
            if !buckets.counts.is_empty() {
                change = change.max(change_to_fit(buckets.low, buckets.high, max_size));
            }
        }
        out.downscale(change);
        out.max_size = max_size;
        out
    }
}

/// `exponential.whole_counts`: the zero, negative and positive bucket counts as integers whose
/// sum is the rounded total (the running total rounded, ties to even, as Python's `round`).
/// `None` where Python raises (a NaN or infinite total) or the total passes 2^63.
pub fn whole_counts(zero: f64, negative: &[f64], positive: &[f64]) -> Option<(u64, Vec<u64>, Vec<u64>)> {
    let mut running = 0.0f64;
    let mut previous: i64 = 0;
    let mut take = |value: f64| -> Option<u64> {
        running += value;
        let rounded = running.round_ties_even();
        // 2^63: past it (or NaN, infinite) the whole count is not an i64.
        if rounded.is_nan() || rounded.abs() >= 9_223_372_036_854_775_808.0 {
            return None;
        }
        let now = rounded as i64;
        let whole = (now - previous).max(0) as u64;
        previous = previous.max(now);
        Some(whole)
    };
    let zero_whole = take(zero)?;
    let negative_whole = negative.iter().map(|&c| take(c)).collect::<Option<Vec<u64>>>()?;
    let positive_whole = positive.iter().map(|&c| take(c)).collect::<Option<Vec<u64>>>()?;
    Some((zero_whole, negative_whole, positive_whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(state: &ExponentialState) -> (i64, Vec<f64>) {
        state.positive.dense()
    }

    #[test]
    fn powers_of_two_are_their_buckets_upper_bound() {
        // (base^(i), base^(i+1)]: 1.0 is the upper bound of bucket -1 at every scale.
        for scale in [-3, 0, 1, 3, 20] {
            let mut state = ExponentialState::new(160, scale);
            state.observe(1.0, 1.0);
            assert_eq!(dense(&state), (-1, vec![1.0]), "scale {scale}");
        }
        let mut state = ExponentialState::new(160, 0);
        state.observe(3.0, 1.0); // (2, 4]: index 1
        state.observe(4.0, 1.0); // upper bound of (2, 4]
        state.observe(4.5, 1.0); // (4, 8]: index 2
        assert_eq!(dense(&state), (1, vec![2.0, 1.0]));
    }

    #[test]
    fn zero_and_nan_go_to_the_zero_bucket_and_negatives_to_their_own() {
        let mut state = ExponentialState::new(160, 20);
        state.observe(0.0, 1.0);
        state.observe(f64::NAN, 0.5);
        state.observe(-1.0, 2.0);
        assert_eq!(state.zero_count, 1.5);
        assert_eq!(state.negative.dense().1, vec![2.0]);
        assert!(state.positive.is_empty());
    }

    #[test]
    fn values_past_the_fast_range_use_the_sdk_mapping() {
        // Subnormal: the bucket below the smallest normal one; infinity: 2^1024's bucket.
        assert_eq!(index_of(5e-324, 3, scale_factor(3)), (-1022 << 3) - 1);
        assert_eq!(index_of(f64::INFINITY, 3, scale_factor(3)), (1024 << 3) - 1);
        assert_eq!(index_of(f64::MAX, 3, scale_factor(3)), ((1023 + 1) << 3) - 1);
        assert_eq!(index_of(5e-324, 0, scale_factor(0)), -1023);
        assert_eq!(index_of(5e-324, -2, scale_factor(-2)), -1022 >> 2);
        assert_eq!(index_of(f64::INFINITY, -2, scale_factor(-2)), 1023 >> 2);
        // The smallest normal value itself goes through the mapping (the fast range excludes it).
        assert_eq!(index_of(f64::MIN_POSITIVE, 3, scale_factor(3)), (-1022 << 3) - 1);
    }

    #[test]
    fn a_wide_range_downscales_just_enough() {
        let mut state = ExponentialState::new(4, 20);
        state.observe(1.5, 1.0);
        state.observe(1000.0, 1.0);
        let (offset, counts) = state.positive.dense();
        assert!(counts.len() <= 4, "{counts:?}");
        assert_eq!(counts.iter().sum::<f64>(), 2.0);
        // 1.5 in (1, 2] and 1000 in (512, 1024] are 9 doublings apart: scale 1 needs 19 buckets, scale -1 five, -2 three.
        assert_eq!(state.scale, -2);
        assert_eq!(offset, 0);
        assert_eq!(counts, vec![1.0, 0.0, 1.0]);
    }

    #[test]
    fn merging_adds_in_first_counted_order() {
        // Python merges dict items in insertion order: here indexes 3, 0, 1, 2 at scale 1 (first
        // counted in that order), all one bucket at scale -1. Summed in ascending index order the
        // same weights give 4.3.
        let mut state = ExponentialState::new(160, 1);
        for (value, weight) in [(3.0, 0.1), (1.2, 0.2), (1.6, 0.3), (2.5, 3.7)] {
            state.observe(value, weight);
        }
        assert_eq!(state.positive.entries().iter().map(|e| e.0).collect::<Vec<_>>(), vec![3, 0, 1, 2]);
        let fitted = state.fitted(160, -1);
        assert_eq!(fitted.scale, -1);
        assert_eq!(fitted.positive.dense(), (0, vec![4.300000000000001]));
    }

    #[test]
    fn fitted_keeps_the_original() {
        let mut state = ExponentialState::new(160, 20);
        for v in [0.001, 0.1, 10.0, 1000.0] {
            state.observe(v, 1.0);
        }
        // 2^-10 .. 2^10 in 160 buckets: scale 3 (20 doublings of 8 buckets).
        assert_eq!(state.scale, 3);
        let before = state.clone();
        let fitted = state.fitted(8, 8);
        assert!(fitted.scale <= 0, "8 buckets for 20 doublings");
        assert!(fitted.positive.dense().1.len() <= 8);
        assert_eq!(fitted.positive.dense().1.iter().sum::<f64>(), 4.0);
        assert_eq!(state, before);
    }

    #[test]
    fn whole_counts_round_the_running_total() {
        assert_eq!(whole_counts(0.0, &[], &[1.45, 1.45, 1.45]), Some((0, vec![], vec![1, 2, 1])));
        assert_eq!(whole_counts(0.5, &[], &[0.5]), Some((0, vec![], vec![1])));
        assert_eq!(whole_counts(f64::NAN, &[], &[]), None);
        assert_eq!(whole_counts(0.0, &[2.5], &[]), Some((0, vec![2], vec![])));
    }

    #[test]
    fn change_to_fit_counts_the_shifts() {
        assert_eq!(change_to_fit(0, 3, 4), 0);
        assert_eq!(change_to_fit(0, 4, 4), 1);
        assert_eq!(change_to_fit(-1, 0, 2), 0);
        assert_eq!(change_to_fit(i64::MIN, i64::MAX, 2), 63);
    }
}
