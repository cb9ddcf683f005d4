"""Rolling per-key quantiles over a time window, in bounded memory.

Values go into log-spaced bins (10 % wide) in one of ``slices`` time slices, and a merged array
is kept up to date as slices expire, so a quantile is one scan of ``_BINS`` counters; the result
is cached and refreshed when enough new values or time have passed. Memory is
O(keys x slices x bins), independent of traffic, and no threshold needs tuning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

_BINS = 200
_MIN = 1e-4  # 0.1 ms
_GROWTH = 1.1  # values within ~10 % share a bin; quantiles are reported at the bin's top edge
_LOG_GROWTH = math.log(_GROWTH)
_EXACT_BELOW = 200  # small windows are recomputed on every query: warm-up must see each new extreme
_REFRESH_S = 0.5


def _bin(value: float) -> int:
    if value <= _MIN:
        return 0
    return min(_BINS - 1, 1 + int(math.log(value / _MIN) / _LOG_GROWTH))


def _upper_edge(index: int) -> float:
    return _MIN * _GROWTH**index


class RollingQuantile:
    __slots__ = ("_slice_s", "_slices", "_clock", "_counts", "_slice_ids", "_merged", "total", "_cached",
                 "_cached_at", "_added_since")

    def __init__(self, window_s: float, slices: int = 10, clock: Callable[[], float] = time.monotonic) -> None:
        self._slice_s = window_s / slices
        self._slices = slices
        self._clock = clock
        self._counts = [[0] * _BINS for _ in range(slices)]
        self._slice_ids = [-1] * slices
        self._merged = [0] * _BINS
        self.total = 0
        self._cached: dict[float, float | None] = {}
        self._cached_at = -math.inf
        self._added_since = 0

    def _current(self, now: float) -> list[int]:
        slice_id = int(now / self._slice_s)
        position = slice_id % self._slices
        if self._slice_ids[position] != slice_id:
            self._expire(position)
            self._slice_ids[position] = slice_id
            # Slices older than the window that were never overwritten (idle periods) expire too.
            oldest_live = slice_id - self._slices + 1
            for other in range(self._slices):
                if 0 <= self._slice_ids[other] < oldest_live:
                    self._expire(other)
            self._cached.clear()
        return self._counts[position]

    def _expire(self, position: int) -> None:
        """Take slice ``position``'s counts out of the merged window and empty it."""
        if self._slice_ids[position] >= 0:
            for index, count in enumerate(self._counts[position]):
                if count:
                    self._merged[index] -= count
                    self.total -= count
        self._counts[position] = [0] * _BINS
        self._slice_ids[position] = -1

    def add(self, value: float) -> None:
        index = _bin(value)
        self._current(self._clock())[index] += 1
        self._merged[index] += 1
        self.total += 1
        self._added_since += 1

    def quantile(self, q: float) -> float | None:
        """Upper edge of the bin holding the q-quantile of the window, or None when empty."""
        return self._quantile(q, self._clock())

    def slice_at(self, now: float) -> tuple[int, int]:
        """(slice id, its position) at ``now``: the same for every window of the same length and slices."""
        slice_id = int(now / self._slice_s)
        return slice_id, slice_id % self._slices

    def quantile_then_add(self, q: float, value: float, now: float, slice_id: int, position: int) -> float | None:
        """``quantile(q)`` then ``add(value)``, both at ``now`` (``slice_at(now)`` is ``slice_id``,
        ``position``): the threshold a value is compared with (the values before it), in one call
        and one clock reading (the sampler's hot path)."""
        if self._slice_ids[position] != slice_id:
            self._current(now)
        total = self.total
        # _quantile's cached answer, inlined for the common case
        if (total >= _EXACT_BELOW and now - self._cached_at < _REFRESH_S and self._added_since < total // 100
                and q in self._cached):
            result = self._cached[q]
        else:
            result = self._quantile(q, now)
        # add, inlined: the slice is current
        if value <= _MIN:
            index = 0
        else:
            index = 1 + int(math.log(value / _MIN) / _LOG_GROWTH)
            if index > _BINS - 1:
                index = _BINS - 1
        self._counts[position][index] += 1
        self._merged[index] += 1
        self.total += 1
        self._added_since += 1
        return result

    def _quantile(self, q: float, now: float) -> float | None:
        self._current(now)
        fresh = (self.total >= _EXACT_BELOW and now - self._cached_at < _REFRESH_S
                 and self._added_since < self.total // 100)
        if fresh and q in self._cached:
            return self._cached[q]
        result = self._compute(q)
        if not fresh:
            self._cached.clear()
            self._cached_at = now
            self._added_since = 0
        self._cached[q] = result
        return result

    def _compute(self, q: float) -> float | None:
        if self.total <= 0:
            return None
        rank = q * self.total
        running = 0
        for index, count in enumerate(self._merged):
            running += count
            if running >= rank:
                return _upper_edge(index)
        return _upper_edge(_BINS - 1)
