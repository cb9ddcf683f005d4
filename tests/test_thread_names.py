"""Busy threads carry their own OS names, so ``top -H`` and the bench can split a process's CPU by thread."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from bench.load import proc_cpu_seconds_by_thread
from otel_llm.internal.runtime import name_thread

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


def _comm(tid: int) -> str:
    return Path(f"/proc/{os.getpid()}/task/{tid}/comm").read_text().strip()


def test_a_named_thread_shows_its_name_and_the_process_keeps_its_own() -> None:
    process_name = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    seen: dict[str, object] = {}
    named = threading.Event()
    release = threading.Event()

    def run() -> None:
        name_thread("otel-llm-a-rather-long-name")
        seen["tid"] = threading.get_native_id()
        named.set()
        release.wait(30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert named.wait(30)
        tid = seen["tid"]
        assert isinstance(tid, int)
        assert _comm(tid) == "otel-llm-a-rath"  # the kernel keeps 15 characters
        assert Path(f"/proc/{os.getpid()}/comm").read_text().strip() == process_name
        assert "otel-llm-a-rath" in proc_cpu_seconds_by_thread(os.getpid())
    finally:
        release.set()
        thread.join(30)


def test_a_started_pipeline_runs_its_worker_and_ticker_under_their_names() -> None:
    from prometheus_client import CollectorRegistry

    from otel_llm.processor.memory_limiter.config import MemoryLimiterProcessor
    from otel_llm.processor.redaction.config import RedactionProcessor
    from otel_llm.receiver.otlp.process import IntakeState, ReceiverCounters, spawn_context
    from otel_llm.service.graph import Pipeline
    from otel_llm.service.telemetry import SelfTelemetry

    context = spawn_context()
    telemetry = SelfTelemetry(CollectorRegistry(), ReceiverCounters(context))
    pipeline = Pipeline({"memory_limiter": MemoryLimiterProcessor(), "redaction": RedactionProcessor()}, [],
                        telemetry, IntakeState(context, 10_000, 1 << 30))
    threads_dir = Path(f"/proc/{os.getpid()}/task")
    before = {tid.name for tid in threads_dir.iterdir()}
    pipeline.start(tick_interval_s=0.05)
    try:
        expected = {"otel-llm-worker", "otel-llm-ticker", "otel-llm-memlim"}
        names: set[str] = set()
        deadline = time.monotonic() + 60
        while not expected <= names and time.monotonic() < deadline:  # each thread names itself as it starts
            names = {_comm(int(tid.name)) for tid in threads_dir.iterdir() if tid.name not in before}
        assert expected <= names
    finally:
        pipeline.shutdown(timeout_s=5)
