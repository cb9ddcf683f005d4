"""The parent's HTTP listener (the metrics port) against one unauthenticated client with nothing
but sockets: more idle connections than the process had file descriptors must stop neither
``/metrics`` nor OTLP ingest, nor the parent; what was cut is counted with its reason."""

from __future__ import annotations

import os
import re
import resource
import socket
import time
import urllib.error
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


def test_the_web_view_is_off_the_scrape_path(tmp_path: Path):
    """Before: the web view was served by the metrics port's handler, and each Overview request
    took a fresh snapshot of the whole registry (one open tab at 2 000 groups made a scrape take
    28.5 s, three tabs 40.9 s). Now it has its own listener and its overview is computed once per
    half refresh interval for every tab: four clients asking for it without pause, plus 200 idle
    connections held on its port, leave every scrape answered within seconds (alone: ~0.5-1 s for
    the ~8 MB exposition), and the metrics port serves none of the web view."""
    import concurrent.futures
    import threading

    from tests.test_bad_input import grpc_raw

    process = ServerProcess(tmp_path, {})
    process.start()
    stop = threading.Event()
    held: list[socket.socket] = []
    try:
        ingest = type("S", (), {"grpc_port": process.grpc_port})()
        for batch in range(4):
            grpc_raw(ingest, vllm_batch(500, model_prefix=f"m{batch}-").SerializeToString())
        process.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") >= 2000, 120, "2 000 requests")
        assert urllib.request.urlopen(process.webview_url + "/api/ui/overview?window=start", timeout=60).status == 200
        with urllib.request.urlopen(process.metrics_url + "/", timeout=10) as response:
            raise AssertionError(f"the metrics port served the web view: {response.status}")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404  # the metrics port has no web view
    try:
        for _ in range(200):
            held.append(socket.create_connection(("127.0.0.1", process.webview_port), timeout=10))
        answered = [0]

        def tab() -> None:
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(process.webview_url + "/api/ui/overview?window=start",
                                                timeout=60) as response:
                        response.read()
                        answered[0] += 1
                except OSError:
                    pass
                stop.wait(0.05)  # a tab asks every refresh_interval (5 s); these ask 100 times as often

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for _ in range(4):
                pool.submit(tab)
            times = []
            for _ in range(10):
                started = time.monotonic()
                with urllib.request.urlopen(process.metrics_url + "/metrics", timeout=60) as response:
                    assert len(response.read()) > 1_000_000  # the exposition of ~200 models (the byte budget)
                times.append(time.monotonic() - started)
            stop.set()
        times.sort()
        print(f"\nscrapes beside 4 Overview clients: median {times[5]:.2f} s, max {times[-1]:.2f} s; "
              f"{answered[0]} overviews answered")
        assert answered[0] >= 1
        assert times[-1] < 5.0, times
    finally:
        stop.set()
        for sock in held:
            sock.close()
        process.ensure_stopped()
