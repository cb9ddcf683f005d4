"""Rolling per-key quantiles over a time window, in bounded memory.

Values go into log-spaced bins (10 % wide) in one of ``slices`` time slices; a quantile sums the
live slices. Memory is O(keys x slices x bins), independent of traffic, and no threshold needs tuning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

_BINS = 200
_MIN = 1e-4  # 0.1 ms
_GROWTH = 1.1  # bin width: values within ~10 % share a bin; quantiles are reported at the bin's top edge
_LOG_GROWTH = math.log(_GROWTH)


def _bin(value: float) -> int:
    if value <= _MIN:
        return 0
    return min(_BINS - 1, 1 + int(math.log(value / _MIN) / _LOG_GROWTH))


def _upper_edge(index: int) -> float:
    return _MIN * _GROWTH**index


class RollingQuantile:
    def __init__(self, window_s: float, slices: int = 10, clock: Callable[[], float] = time.monotonic) -> None:
        self._slice_s = window_s / slices
        self._slices = slices
        self._clock = clock
        self._counts = [[0] * _BINS for _ in range(slices)]
        self._slice_ids = [-1] * slices
        self.total = 0

    def _current(self) -> list[int]:
        slice_id = int(self._clock() / self._slice_s)
        position = slice_id % self._slices
        if self._slice_ids[position] != slice_id:
            self.total -= sum(self._counts[position]) if self._slice_ids[position] >= 0 else 0
            self._counts[position] = [0] * _BINS
            self._slice_ids[position] = slice_id
        return self._counts[position]

    def add(self, value: float) -> None:
        self._current()[_bin(value)] += 1
        self.total += 1

    def quantile(self, q: float) -> float | None:
        """Upper edge of the bin holding the q-quantile of the window, or None when empty."""
        self._current()
        live = int(self._clock() / self._slice_s) - self._slices
        merged = [0] * _BINS
        count = 0
        for position in range(self._slices):
            if self._slice_ids[position] > live:
                for index, n in enumerate(self._counts[position]):
                    if n:
                        merged[index] += n
                        count += n
        if count == 0:
            return None
        rank = q * count
        running = 0
        for index, n in enumerate(merged):
            running += n
            if running >= rank:
                return _upper_edge(index)
        return _upper_edge(_BINS - 1)
