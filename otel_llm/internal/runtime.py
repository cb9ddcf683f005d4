"""Process-level settings of the CPython runtime, applied by each of otel-llm's processes."""

from __future__ import annotations

import ctypes
import gc
import sys

_PR_SET_NAME = 15


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def name_process(name: str) -> None:
    """Show ``name`` (15 characters at most) in ``top``, ``ps -o comm`` and /proc/PID/comm, so an
    operator sees which of otel-llm's processes is busy."""
    libc = _libc()
    if libc is not None and hasattr(libc, "prctl"):
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def name_thread(name: str) -> None:
    """Show ``name`` (15 characters at most) as the calling thread's name in ``top -H``, ``ps -L``
    and /proc/PID/task/TID/comm (Python 3.11's ``threading`` does not set it): every thread of a
    process otherwise shows the process's name, so the CPU a busy server spends per thread (the
    pipeline worker, the assembler's ticker, the pipe reader, the store's writer) cannot be told apart."""
    name_process(name)  # PR_SET_NAME names the calling thread; on the main thread that is the process


def tune_gc(switch_interval_s: float | None = None) -> None:
    """The hot path allocates millions of short-lived, acyclic objects; with CPython's default
    threshold (700) the cyclic collector ran for ~40 % of the pipeline's time (bench profile).
    Everything alive after start-up is frozen out of collections; reference counting frees
    almost everything immediately. A young collection walks every object made since the last
    one that is still alive — every trace buffered and every decision cached since then — so at
    a threshold of 50 000 the saturated server's young collections took 35–50 ms each on average
    (up to 145 ms), 1.4 CPU-s of a 30-s window (5 %), and found no garbage; at 1 000 000 none ran
    in that window.
    Cyclic garbage (none was found at a steady rate) is bounded by the threshold's count, and
    the memory limiter collects when memory passes its soft limit.
    ``switch_interval_s`` also sets the GIL switch interval, for processes whose pipe reader
    thread must get the GIL back promptly from a busy worker."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(1_000_000, 50, 100)
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft limit on open file descriptors to the hard one (as Go's runtime does since
    1.19): the default soft limit (often 1 024) is what a thousand idle connections exhaust, and
    every connection, SQLite file and pipe shares it. Returns (before, after); the receiver
    processes inherit it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target
