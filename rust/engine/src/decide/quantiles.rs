//! `processor/tail_sampling/quantiles.py`'s `RollingQuantile` (the `slowest` policy's windows), out
//! of the binding's PyO3 class (`rust/src/quantiles.rs`): the same bins, slices, cache and IEEE
//! operations (`math.log` and `**` are the C library's `log` and `pow`, as `f64::ln` and
//! `f64::powf` are), so a threshold is the same float. The clock is the caller's: every method
//! that reads `self._clock()` in Python takes `now`.

use std::fmt;

const BINS: usize = 200;
const MIN: f64 = 1e-4;
const GROWTH: f64 = 1.1;
/// `_EXACT_BELOW`: small windows are recomputed on every query (warm-up must see each new extreme).
const EXACT_BELOW: i64 = 200;
const REFRESH_S: f64 = 0.5;
/// The slices `RollingQuantile` is made with by default (`slices=10`), as `SlowestPolicy` makes it.
pub const SLICES: usize = 10;

/// Why a value or an instant has no bin or slice. The first two are the exceptions Python's
/// `int()` raises there (`ValueError`, `OverflowError`); the third is where Python would go on with
/// an integer past 64 bits, which this port does not hold: a slice number past 2^63 (an instant
/// ~29 million years into a monotonic clock at the shortest window): declined, never guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unbinnable {
    Nan,
    Infinite,
    Beyond64Bits,
}

impl Unbinnable {
    /// The Python exception class the reference raises, or "" where it raises none.
    pub fn python_exception(self) -> &'static str {
        match self {
            Unbinnable::Nan => "ValueError",
            Unbinnable::Infinite => "OverflowError",
            Unbinnable::Beyond64Bits => "",
        }
    }
}

impl fmt::Display for Unbinnable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unbinnable::Nan => "cannot convert float NaN to integer",
            Unbinnable::Infinite => "cannot convert float infinity to integer",
            Unbinnable::Beyond64Bits => "a slice number past 2^63: not ported (Python's integers are unbounded)",
        })
    }
}

impl std::error::Error for Unbinnable {}

/// Python's `int(x)` of a float: truncation, with the errors `int()` raises for NaN and infinities.
fn truncated(x: f64) -> Result<i64, Unbinnable> {
    if x.is_nan() {
        return Err(Unbinnable::Nan);
    }
    if x.is_infinite() {
        return Err(Unbinnable::Infinite);
    }
    // -2^63 <= x < 2^63: the truncation fits an i64 exactly.
    let limit = (1u64 << 63) as f64;
    if !(-limit..limit).contains(&x) {
        return Err(Unbinnable::Beyond64Bits);
    }
    Ok(x.trunc() as i64)
}

/// `quantiles._bin` (and its copy inlined in `quantile_then_add`).
fn bin_of(value: f64, log_growth: f64) -> Result<usize, Unbinnable> {
    if value <= MIN {
        return Ok(0);
    }
    // value / MIN past f64::MAX is infinity, whose log is infinity: Python's OverflowError too.
    let index = 1 + truncated((value / MIN).ln() / log_growth)?;
    Ok(if index > (BINS - 1) as i64 { BINS - 1 } else { index as usize })
}

/// A time slice of a window: its number since the clock's zero and its position among the slices
/// (`RollingQuantile.slice_at`'s pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub id: i64,
    pub position: usize,
}

/// `quantiles._upper_edge`.
pub fn upper_edge(index: usize) -> f64 {
    MIN * GROWTH.powf(index as f64)
}

/// `quantiles.RollingQuantile`: values in log-spaced bins (10 % wide) in `slices` time slices of
/// a window, a merged array kept as slices expire, and a cached answer refreshed when enough new
/// values or time have passed.
#[derive(Clone, Debug)]
pub struct RollingQuantile {
    slice_s: f64,
    slices: usize,
    counts: Vec<[i64; BINS]>,
    slice_ids: Vec<i64>,
    merged: [i64; BINS],
    total: i64,
    /// `_cached`: q -> answer (a dict in Python; one or two entries in practice).
    cached: Vec<(f64, Option<f64>)>,
    cached_at: f64,
    added_since: i64,
    log_growth: f64,
}

impl RollingQuantile {
    /// `RollingQuantile(window_s, slices)`. Python divides by zero on every query for a window of
    /// 0 (the configuration refuses it, and any window not positive); here it is refused up front.
    pub fn new(window_s: f64, slices: usize) -> Result<RollingQuantile, String> {
        if slices == 0 {
            return Err("slices must be at least 1".into());
        }
        if !(window_s > 0.0 && window_s.is_finite()) {
            return Err(format!("a window must be a positive duration, got {window_s}"));
        }
        Ok(RollingQuantile {
            slice_s: window_s / slices as f64,
            slices,
            counts: vec![[0; BINS]; slices],
            slice_ids: vec![-1; slices],
            merged: [0; BINS],
            total: 0,
            cached: Vec::new(),
            cached_at: f64::NEG_INFINITY,
            added_since: 0,
            log_growth: GROWTH.ln(),
        })
    }

    /// How many values the window holds.
    pub fn total(&self) -> i64 {
        self.total
    }

    /// `_current`: the slice at `now` made current (expired slices taken out), its position.
    fn current(&mut self, now: f64) -> Result<usize, Unbinnable> {
        let Slice { id: slice_id, position } = self.slice_at(now)?;
        if self.slice_ids[position] != slice_id {
            self.expire(position);
            self.slice_ids[position] = slice_id;
            // Slices older than the window that were never overwritten (idle periods) expire too.
            let oldest_live = slice_id.saturating_sub(self.slices as i64 - 1);
            for other in 0..self.slices {
                if 0 <= self.slice_ids[other] && self.slice_ids[other] < oldest_live {
                    self.expire(other);
                }
            }
            self.cached.clear();
        }
        Ok(position)
    }

    /// `_expire`: slice `position`'s counts out of the merged window, and the slice emptied.
    fn expire(&mut self, position: usize) {
        if self.slice_ids[position] >= 0 {
            for (merged, count) in self.merged.iter_mut().zip(self.counts[position].iter()) {
                *merged -= count;
                self.total -= count;
            }
        }
        self.counts[position] = [0; BINS];
        self.slice_ids[position] = -1;
    }

    /// `add`: the value binned first (a value without a bin changes nothing), then counted in the
    /// slice current at `now`.
    pub fn add(&mut self, value: f64, now: f64) -> Result<(), Unbinnable> {
        bin_of(value, self.log_growth)?;
        let position = self.current(now)?;
        self.add_at(position, value)
    }

    /// `quantile`: the upper edge of the bin holding the q-quantile of the window, None when empty.
    pub fn quantile(&mut self, q: f64, now: f64) -> Result<Option<f64>, Unbinnable> {
        self.quantile_at(q, now)
    }

    /// `slice_at`: the slice at `now`, the same for every window of the same length and slices.
    pub fn slice_at(&self, now: f64) -> Result<Slice, Unbinnable> {
        let id = truncated(now / self.slice_s)?;
        Ok(Slice { id, position: id.rem_euclid(self.slices as i64) as usize })
    }

    /// `quantile_then_add`: `quantile(q)` then `add(value)`, both at `now` (`slice` is
    /// `slice_at(now)`): the threshold a value is compared with is of the values before it.
    /// The quantile (and its cache) is updated before the value is binned, as in Python: a value
    /// without a bin leaves that much done.
    pub fn quantile_then_add(&mut self, q: f64, value: f64, now: f64, slice: Slice) -> Result<Option<f64>, Unbinnable> {
        let position = match self.slice_ids.get(slice.position) {
            Some(id) if *id == slice.id => slice.position,
            // Not current yet (or a slice of another window's shape): made current as `_current` does.
            _ => self.current(now)?,
        };
        let result = match self.cached_of(q) {
            Some(known) if self.fresh(now) => known,
            _ => self.quantile_at(q, now)?,
        };
        self.add_at(position, value)?;
        Ok(result)
    }

    /// Whether a cached answer still answers: the window is past its exact size, the answer younger
    /// than `REFRESH_S` and fewer than 1 % of the window added since.
    fn fresh(&self, now: f64) -> bool {
        self.total >= EXACT_BELOW && now - self.cached_at < REFRESH_S && self.added_since < self.total.div_euclid(100)
    }

    /// `q in self._cached`: a dict finds its key by identity first, so the policy's own quantile is
    /// found even where it is NaN (same bits), and by equality (0.0 finds -0.0).
    fn cached_of(&self, q: f64) -> Option<Option<f64>> {
        self.cached.iter().find(|(key, _)| *key == q || key.to_bits() == q.to_bits()).map(|(_, value)| *value)
    }

    /// `_quantile`.
    fn quantile_at(&mut self, q: f64, now: f64) -> Result<Option<f64>, Unbinnable> {
        self.current(now)?;
        let fresh = self.fresh(now);
        if fresh {
            if let Some(known) = self.cached_of(q) {
                return Ok(known);
            }
        }
        let result = self.compute(q);
        if !fresh {
            self.cached.clear();
            self.cached_at = now;
            self.added_since = 0;
        }
        match self.cached.iter_mut().find(|(key, _)| *key == q || key.to_bits() == q.to_bits()) {
            Some(entry) => entry.1 = result,
            None => self.cached.push((q, result)),
        }
        Ok(result)
    }

    /// `_compute`: the first bin whose running count reaches `q * total`. Python compares the int
    /// count with the float rank exactly; counts stay far below 2^53, where `as f64` is exact too.
    fn compute(&self, q: f64) -> Option<f64> {
        if self.total <= 0 {
            return None;
        }
        let rank = q * self.total as f64;
        let mut running: i64 = 0;
        for (index, count) in self.merged.iter().enumerate() {
            running += count;
            if running as f64 >= rank {
                return Some(upper_edge(index));
            }
        }
        Some(upper_edge(BINS - 1))
    }

    fn add_at(&mut self, position: usize, value: f64) -> Result<(), Unbinnable> {
        let index = bin_of(value, self.log_growth)?;
        self.counts[position][index] += 1;
        self.merged[index] += 1;
        self.total += 1;
        self.added_since += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bin(value: f64) -> usize {
        bin_of(value, GROWTH.ln()).unwrap()
    }

    #[test]
    fn bins_are_ten_percent_wide_from_a_tenth_of_a_millisecond() {
        assert_eq!(bin(0.0), 0);
        assert_eq!(bin(-5.0), 0);
        assert_eq!(bin(MIN), 0);
        assert_eq!(bin(f64::from_bits(MIN.to_bits() + 1)), 1);
        assert_eq!(bin(1.05e-4), 1);
        assert_eq!(bin(1e300), BINS - 1);
        assert_eq!(upper_edge(0), MIN);
        // a value just above a bin's lower edge is within 10 % of the upper edge reported for it
        for value in [0.0123, 0.5, 7.0, 42.0] {
            let edge = upper_edge(bin(value));
            assert!(value < edge && edge <= value * 1.1 * (1.0 + 1e-12), "{value} -> {edge}");
        }
    }

    #[test]
    fn values_python_cannot_convert_raise_its_errors_and_change_nothing() {
        let mut window = RollingQuantile::new(10.0, SLICES).unwrap();
        window.add(0.5, 100.0).unwrap();
        assert_eq!(window.add(f64::NAN, 100.0), Err(Unbinnable::Nan));
        assert_eq!(window.add(f64::INFINITY, 100.0), Err(Unbinnable::Infinite));
        // 1e300 / 1e-4 overflows to infinity before the log: Python's OverflowError as well
        assert_eq!(window.add(f64::MAX, 100.0), Err(Unbinnable::Infinite));
        assert_eq!(window.add(f64::NEG_INFINITY, 100.0), Ok(())); // below the first bin
        assert_eq!(window.total(), 2);
        assert_eq!(Unbinnable::Nan.python_exception(), "ValueError");
        assert_eq!(Unbinnable::Infinite.to_string(), "cannot convert float infinity to integer");
        assert_eq!(window.slice_at(f64::NAN), Err(Unbinnable::Nan));
        assert_eq!(window.slice_at(1e300), Err(Unbinnable::Beyond64Bits));
    }

    #[test]
    fn a_value_without_a_bin_leaves_the_quantile_it_read_cached() {
        let mut window = RollingQuantile::new(100.0, SLICES).unwrap();
        let slice = window.slice_at(5.0).unwrap();
        assert_eq!(window.quantile_then_add(0.5, f64::NAN, 5.0, slice), Err(Unbinnable::Nan));
        assert_eq!(window.total(), 0);
        assert_eq!(window.cached, vec![(0.5, None)]);
        assert_eq!(window.cached_at, 5.0);
    }

    #[test]
    fn the_first_value_has_no_threshold_and_later_ones_see_the_values_before_them() {
        let mut window = RollingQuantile::new(600.0, SLICES).unwrap();
        let slice = window.slice_at(1000.0).unwrap();
        assert_eq!(window.quantile_then_add(0.99, 0.2, 1000.0, slice), Ok(None));
        assert_eq!(window.quantile_then_add(0.99, 0.5, 1000.0, slice), Ok(Some(upper_edge(bin(0.2)))));
        assert_eq!(window.quantile(0.99, 1000.0), Ok(Some(upper_edge(bin(0.5)))));
        assert_eq!(window.quantile(0.0, 1000.0), Ok(Some(upper_edge(0))));
    }

    #[test]
    fn slices_expire_when_their_position_is_reused_and_when_idle_past_the_window() {
        let mut window = RollingQuantile::new(10.0, SLICES).unwrap(); // 1 s slices
        window.add(5.0, 100.5).unwrap();
        window.add(0.01, 105.5).unwrap();
        assert_eq!(window.total(), 2);
        window.add(0.01, 110.2).unwrap(); // slice 110 reuses slice 100's position
        assert_eq!(window.total(), 2);
        assert_eq!(window.quantile(1.0, 110.2), Ok(Some(upper_edge(bin(0.01)))));
        window.add(0.01, 114.9).unwrap(); // slices 105 to 114 are the window: 105 is still live
        assert_eq!(window.total(), 3);
        window.add(0.01, 115.1).unwrap(); // slice 115 reuses 105's position
        assert_eq!(window.total(), 3);
        window.add(0.01, 125.9).unwrap(); // 110, 114 and 115 are past the window: expired though not reused
        assert_eq!(window.total(), 1);
        assert_eq!(window.quantile(0.5, 200.0), Ok(None));
    }

    #[test]
    fn a_cached_threshold_lives_half_a_second_or_one_percent_of_the_window_or_until_a_new_slice() {
        // tests/test_native_core.py's last check: 300 values, a threshold cached, two extremes added.
        for (start, crosses_slice) in [(1.0, false), (9.8, true)] {
            let mut window = RollingQuantile::new(100.0, SLICES).unwrap();
            for _ in 0..300 {
                window.add(0.01, start).unwrap();
            }
            let cached = window.quantile(0.999, start).unwrap();
            window.add(50.0, start).unwrap();
            window.add(50.0, start).unwrap();
            let seen: Vec<Option<f64>> =
                (1..=60).map(|step| window.quantile(0.999, start + step as f64 * 0.01).unwrap()).collect();
            let last = seen[59];
            assert_eq!(seen[0], cached);
            assert!(last > cached);
            let first_new = seen.iter().position(|s| *s == last).unwrap();
            assert_eq!(first_new < 25, crosses_slice, "{seen:?}");
            if !crosses_slice {
                assert_eq!(first_new, 49, "refreshed 0.5 s after it was cached"); // start + 0.50
            }
        }
        // 1 % of the window added since: a refresh without waiting.
        let mut window = RollingQuantile::new(100.0, SLICES).unwrap();
        for _ in 0..300 {
            window.add(0.01, 1.0).unwrap();
        }
        let cached = window.quantile(0.999, 1.0).unwrap();
        // One extreme moves the exact answer (rank 300.7 of 301) but is not 1 % of the window.
        window.add(50.0, 1.0).unwrap();
        assert_eq!(window.quantile(0.999, 1.0).unwrap(), cached); // 1 < 301 // 100
        window.add(50.0, 1.0).unwrap();
        assert_eq!(window.quantile(0.999, 1.0).unwrap(), cached); // 2 < 302 // 100
        window.add(50.0, 1.0).unwrap();
        assert_eq!(window.quantile(0.999, 1.0).unwrap(), Some(upper_edge(bin(50.0)))); // 3 == 303 // 100
    }

    #[test]
    fn a_value_in_a_new_slice_drops_the_cached_threshold_before_it_is_compared() {
        let mut window = RollingQuantile::new(100.0, SLICES).unwrap(); // 10 s slices
        for _ in 0..300 {
            window.add(0.01, 9.8).unwrap();
        }
        let cached = window.quantile(0.999, 9.8).unwrap();
        window.add(50.0, 9.8).unwrap();
        window.add(50.0, 9.8).unwrap(); // 2 < 302 // 100: the cached answer would still be fresh
        let slice = window.slice_at(10.01).unwrap();
        assert_eq!(slice, Slice { id: 1, position: 1 });
        let threshold = window.quantile_then_add(0.999, 0.01, 10.01, slice).unwrap();
        assert_ne!(threshold, cached);
        assert_eq!(threshold, Some(upper_edge(bin(50.0))), "the new slice's threshold is of the whole window");
        assert_eq!(window.slice_ids[1], 1);
        assert_eq!(window.counts[1][bin(0.01)], 1, "the value is counted in its own slice");
    }

    /// The exact q-quantile of `values` as the algorithm defines its rank: the smallest value whose
    /// count of values at or below it reaches `q * n`.
    fn exact(values: &[f64], q: f64) -> f64 {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = q * sorted.len() as f64;
        let k = (1..=sorted.len()).find(|k| *k as f64 >= rank).unwrap_or(sorted.len());
        sorted[k - 1]
    }

    proptest! {
        /// Against the exact quantile of the values inside the window (those of the last `slices`
        /// slices): the bin's upper edge of the exact answer, so within the stated error (the
        /// answer is at most 10 % above the exact value and never below it) for values inside the
        /// bins' range. Queries are half a second apart, where no cached answer is reused.
        #[test]
        fn a_quantile_is_the_upper_edge_of_the_exact_quantiles_bin(
            steps in prop::collection::vec((0.0f64..1.0, 1e-4f64..1e3, 0u8..4), 1..600),
            q in prop_oneof![Just(0.5), Just(0.9), Just(0.99), Just(1.0), 0.01f64..1.0],
            slices in 1usize..12,
            window_s in prop_oneof![Just(10.0), Just(600.0), 0.5f64..100.0],
        ) {
            let mut window = RollingQuantile::new(window_s, slices).unwrap();
            let slice_s = window_s / slices as f64;
            let mut now = 1000.0;
            let mut added: Vec<(i64, f64)> = Vec::new();
            for (step, value, kind) in steps {
                // mostly within a slice, sometimes across slices or past the whole window
                now += match kind { 0 => step * slice_s * 3.0, 1 => step * window_s * 2.0, _ => 0.5 + step * 0.1 };
                window.add(value, now).unwrap();
                added.push(((now / slice_s).trunc() as i64, value));
                now += 0.5;
                let current = (now / slice_s).trunc() as i64;
                let live: Vec<f64> = added.iter().filter(|(id, _)| *id > current - slices as i64)
                    .map(|(_, v)| *v).collect();
                let got = window.quantile(q, now).unwrap();
                prop_assert_eq!(window.total(), live.len() as i64);
                if live.is_empty() {
                    prop_assert_eq!(got, None);
                    continue;
                }
                let truth = exact(&live, q);
                let got = got.unwrap();
                prop_assert_eq!(got, upper_edge(bin(truth)));
                if truth > MIN && truth < upper_edge(BINS - 2) {
                    prop_assert!(truth <= got * (1.0 + 1e-12) && got <= truth * 1.1 * (1.0 + 1e-12),
                                 "{} vs exact {}", got, truth);
                }
            }
        }

        /// Whatever the values and instants (NaN, infinities, the clock going back), the window
        /// never holds more than was added, never a negative count, and its bins sum to its total.
        #[test]
        fn counts_stay_consistent_under_any_input(
            ops in prop::collection::vec((any::<f64>(), -50.0f64..50.0, 0u8..3), 1..300),
        ) {
            let mut window = RollingQuantile::new(10.0, SLICES).unwrap();
            let mut now = 100.0;
            let mut added = 0i64;
            for (value, step, kind) in ops {
                now = (now + step).max(0.0);
                let result = match kind {
                    0 => window.add(value, now).map(|_| None),
                    1 => window.quantile(0.9, now),
                    _ => {
                        let slice = window.slice_at(now).unwrap();
                        window.quantile_then_add(0.9, value, now, slice)
                    }
                };
                if kind != 1 && result.is_ok() {
                    added += 1;
                }
                prop_assert!(window.total() <= added);
                prop_assert!(window.merged.iter().all(|c| *c >= 0));
                prop_assert_eq!(window.merged.iter().sum::<i64>(), window.total());
                let in_slices: i64 = window.counts.iter().flatten().sum();
                prop_assert_eq!(in_slices, window.total());
            }
        }
    }
}
