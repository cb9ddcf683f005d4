"""Keeps the process under a memory limit, as the Collector's memory_limiter does: above the soft
limit (limit - spike) new data is refused with a retry hint and the oldest buffered traces are
completed early, so memory is released instead of growing until the kernel kills us."""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from otel_llm.internal.runtime import name_thread
from otel_llm.processor.memory_limiter.config import MemoryLimiterProcessor

log = logging.getLogger(__name__)
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


def available_memory_bytes() -> int:
    """The cgroup v2/v1 limit when there is one, else physical memory."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_limits(settings: MemoryLimiterProcessor) -> tuple[int, int]:
    """(hard limit, spike allowance) in bytes; refusing starts at ``limit - spike``."""
    limit = settings.limit_mib * 1024 * 1024 or int(available_memory_bytes() * settings.limit_percentage / 100)
    return limit, settings.spike_limit_mib * 1024 * 1024 or limit // 5


# A request's spans take ~2.5x its wire size once buffered (bench mix: ~600 B per span on the wire,
# ~1.5 KB buffered): admitted requests not yet processed are counted at that size.
BUFFERED_PER_WIRE_BYTE = 2.5


def intake_bytes_bound(spike_bytes: int) -> int:
    """Request bytes admitted and not yet processed: once buffered, they fill at most 5/8 of the spike
    allowance, which leaves room for completion's own allocations (a quarter of it, in bytes)."""
    return int(spike_bytes * 0.625 / BUFFERED_PER_WIRE_BYTE)


class MemoryLimiter:
    def __init__(self, settings: MemoryLimiterProcessor, shed: Callable[[], int],
                 rss: Callable[[], int] = rss_bytes, on_change: Callable[[bool], None] = lambda refusing: None) -> None:
        limit, spike = memory_limits(settings)
        self.limit_bytes = limit
        self.soft_limit_bytes = limit - spike
        self._interval = settings.check_interval
        self._shed = shed
        self._rss = rss
        self._refusing = False
        self._on_change = on_change  # tells the receivers, which live in another process
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def refusing(self) -> bool:
        return self._refusing

    @refusing.setter
    def refusing(self, value: bool) -> None:
        if value != self._refusing:
            self._refusing = value
            self._on_change(value)

    def refuse_if_over(self, pending_bytes: int) -> None:
        """The data path's check, as requests arrive: receivers admit far faster than one
        ``check_interval`` allows for, and RSS shows a request only once it is processed, so what is
        admitted and still pending counts at its buffered size. Refusing starts at once; shedding and
        recovery stay periodic."""
        if not self._refusing:
            expected = self._rss() + int(pending_bytes * BUFFERED_PER_WIRE_BYTE)
            if expected > self.soft_limit_bytes:
                self._start_refusing(expected)

    def check(self) -> None:
        rss = self._rss()
        if rss <= self.soft_limit_bytes:
            if self.refusing:
                log.info("memory back under the soft limit (%d MiB): accepting data again", rss >> 20)
            self.refusing = False
            return
        if not self._refusing:
            self._start_refusing(rss)
        self._shed()
        gc.collect()

    def _start_refusing(self, rss: int) -> None:
        log.warning("memory %d MiB above the soft limit %d MiB: refusing data, completing traces early",
                    rss >> 20, self.soft_limit_bytes >> 20)
        self.refusing = True

    def start(self) -> None:
        def run() -> None:
            name_thread("otel-llm-memlim")
            while not self._stop.wait(self._interval):
                try:
                    self.check()
                except Exception:  # the limiter must never be what stops the process
                    log.exception("memory check failed")

        self._thread = threading.Thread(target=run, name="otel-llm-memory-limiter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
