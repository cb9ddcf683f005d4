"""The parent's HTTP listener (the metrics port) against one unauthenticated client with nothing
but sockets: more idle connections than the process had file descriptors must stop neither
``/metrics`` nor OTLP ingest, nor the parent; what was cut is counted with its reason."""

from __future__ import annotations

import os
import re
import resource
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.otelllm import ServerProcess, scrape_metrics
from tests.support.payloads import vllm_batch
from tests.test_bad_input import http_post

REFUSED = "otel_llm_http_refused_connections_total"


def _soft_fd_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(re.split(r"\s{2,}", line)[1])
    raise AssertionError("no 'Max open files' line")


def test_more_idle_connections_than_descriptors_stop_neither_metrics_nor_ingest(tmp_path: Path):
    """Started with a soft descriptor limit of 1 024 (the usual default), otel-llm raises it to
    the hard limit; 1 200 connections to the metrics port that never send a byte (before: the
    parent ran out of descriptors, /metrics timed out and the next OTLP request stopped it with
    exit 1) now hold at most ``max_connections`` of the parent's descriptors: each new one evicts
    the longest-waiting idle one (counted ``evicted_idle``), so a scrape is answered at once, and
    OTLP is still taken and measured."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2600:
        pytest.skip(f"the hard descriptor limit ({hard}) is too low to hold 1 200 connections here")
    process = ServerProcess(tmp_path, {"exporters": {"prometheus": {"max_connections": 64,
                                                                    "read_header_timeout": "120s",
                                                                    "read_timeout": "120s"}}})
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # inherited by otel-llm
    try:
        process.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    held: list[socket.socket] = []
    try:
        assert process.process is not None
        parent = process.process.pid
        assert _soft_fd_limit(parent) == (hard if hard != resource.RLIM_INFINITY else _soft_fd_limit(parent))
        assert _soft_fd_limit(parent) > 1024, "the soft limit was not raised"
        for _ in range(1200):
            held.append(socket.create_connection(("127.0.0.1", process.metrics_port), timeout=10))
        # The parent holds about the cap's worth of them, not 1 200.
        deadline = time.monotonic() + 30
        while len(os.listdir(f"/proc/{parent}/fd")) > 400 and time.monotonic() < deadline:
            time.sleep(0.1)
        descriptors = len(os.listdir(f"/proc/{parent}/fd"))
        assert descriptors <= 400, f"the parent holds {descriptors} descriptors"
        started = time.monotonic()
        scrape = scrape_metrics(process.metrics_url)  # 10 s timeout: before, it never came
        scrape_s = time.monotonic() - started
        assert scrape.value(REFUSED, listener="prometheus", reason="evicted_idle") >= 1000
        with urllib.request.urlopen(process.metrics_url + "/readyz", timeout=10) as response:
            assert response.status == 200
        ingest = type("S", (), {"http_port": process.http_port})()
        assert http_post(ingest, vllm_batch(1).SerializeToString())[0] == 200
        process.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") >= 1, 30, "the span taken")
        assert process.process.poll() is None, "the parent exited"
        print(f"\n1 200 idle connections: parent at {descriptors} descriptors, a scrape in {scrape_s:.2f} s")
    finally:
        for sock in held:
            sock.close()
    assert process.stop() == 0
    process.ensure_stopped()
