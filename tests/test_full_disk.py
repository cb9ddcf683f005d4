"""A full disk at start-up (issue 50's leftovers): the store, the intake log and an exporter's on-disk
queue on a real 4 MiB tmpfs filled by someone else (ENOSPC).

What an SRE gets is what a disk that fills while otel-llm runs gives: the process starts and serves,
``/readyz`` is 503 naming the component and its path (a load balancer sends elsewhere, the pod is
not restarted in a loop), what cannot be kept is refused retryably or counted, and once space returns
the component recovers by itself, with no restart. ``otel-llm serve`` runs as a process; every wait
polls ``/readyz``, ``/metrics`` or the disk."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.payloads import vllm_batch
from tests.test_intake_log import EXPORT, GroupServer, _fill, count, send, small_filesystem  # noqa: F401 (fixture)
from tests.test_receiver_process import poll
from tests.test_trace_assembly import _post

KEEP_ALL = [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]
SAMPLING = {"tail_sampling": {"decision_wait": "1s", "grace": "100ms", "policies": KEEP_ALL}}


def _readyz(server: GroupServer) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{server.metrics_url}/readyz", timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _ready_again(server: GroupServer) -> None:
    poll(lambda: _readyz(server)[0] == 200, 30, "/readyz 200 once the space is back")


def _start(tmp_path: Path, config: dict[str, Any], degraded: bool = True) -> GroupServer:
    server = GroupServer(tmp_path, config)
    server.start(timeout_s=60, degraded=degraded)  # it used to exit 1 here (the store, a crashed intake log)
    return server


def _start_full(tmp_path: Path, filesystem: Path, config: dict[str, Any]) -> tuple[GroupServer, Path]:
    """``filesystem`` filled, then otel-llm started on it; and the filler, whose removal gives the room back."""
    filler = filesystem / "filler"
    _fill(filler)
    return _start(tmp_path, config), filler


def test_the_store_starts_on_a_full_disk_and_persists_once_there_is_room(tmp_path: Path, small_filesystem: Path):
    """A restart with the store's filesystem full: it exited 1 with SQLite's "disk I/O error". Now it
    starts with ``/readyz`` 503 naming the store's file and the full disk, kept traces are dropped
    counted ``disk_full``, and once space returns the store opens by itself and writes again."""
    config = {"processors": SAMPLING, "exporters": {"store": {"path": str(small_filesystem / "store")}}}
    first = _start(tmp_path, config, degraded=False)
    try:
        assert send(first, 1, "before", rooted=3, unrooted=0) == 3
        poll(lambda: len(StoreReader(small_filesystem / "store").list_requests(limit=10)) == 3, 30, "stored")
        assert first.stop() == 0
    finally:
        first.ensure_stopped()
    server, filler = _start_full(tmp_path, small_filesystem, config)
    try:
        status, body = _readyz(server)
        assert status == 503 and "traces.db" in body and "no space left" in body, body
        assert send(server, 1, "while-full", rooted=2, unrooted=0) == 2  # measured; not stored, counted
        scrape = server.wait_until(lambda s: s.value("otel_llm_store_dropped_traces_total", reason="disk_full") == 2,
                                   what="the kept traces the full store could not take, counted")
        assert count(scrape, "while-full-rooted") == 2
        filler.unlink()
        _ready_again(server)
        assert send(server, 1, "after", rooted=2, unrooted=0) == 2
        poll(lambda: len(StoreReader(small_filesystem / "store").list_requests(limit=10)) == 5, 30,
             "written once there is room")
        assert server.stop() == 0
    finally:
        server.ensure_stopped()


def test_a_crashed_intake_log_restarts_on_a_full_disk_and_replays_once_there_is_room(tmp_path: Path,
                                                                                      small_filesystem: Path):
    """SIGKILL with requests pending in the log, and the log's filesystem then filled: the restart
    exited 1 (compacting the journals needs room). Now it starts, keeps the journals as they are,
    replays, says on ``/readyz`` that the log is below its floor, refuses new requests retryably,
    and once space returns takes them again; every acknowledged request is measured once."""
    config: dict[str, Any] = {
        "processors": {"tail_sampling": {**SAMPLING["tail_sampling"], "decision_wait": "60s"}},
        "receivers": {"otlp": {"intake_log": {"directory": str(small_filesystem / "log"), "min_free_mib": 1,
                                              "segment_size_mib": 1, "max_size_mib": 3}}}}
    first = _start(tmp_path, config, degraded=False)
    try:
        assert send(first, 5, "crash", rooted=2, unrooted=2) == 20
        first.wait_until(lambda s: count(s, "crash-rooted") == 10 and s.value("otel_llm_traces_in_memory") == 10,
                         what="the rooted traces decided (journaled), the others pending")
        first.kill_group()
    finally:
        first.ensure_stopped()
    config["processors"]["tail_sampling"]["decision_wait"] = "1s"
    server, filler = _start_full(tmp_path, small_filesystem, config)
    try:
        status, body = _readyz(server)
        assert status == 503 and "receivers.otlp.intake_log" in body and str(small_filesystem / "log") in body, body
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            try:
                channel.unary_unary(EXPORT)(vllm_batch(5, model="refused").SerializeToString(), timeout=10)
                raise AssertionError("accepted into a log below its floor")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and "intake_log_full" in str(exc.details())
        scrape = server.wait_until(lambda s: count(s, "crash-unrooted") == 10, what="the replayed requests decided")
        assert count(scrape, "crash-rooted") == 0, "decided before the crash: not measured again"
        filler.unlink()
        _ready_again(server)
        assert send(server, 2, "after", rooted=1, unrooted=0) == 2
        server.wait_until(lambda s: count(s, "after-rooted") == 2, what="taken once there is room")
        assert server.stop() == 0
    finally:
        server.ensure_stopped()


def test_an_on_disk_sending_queue_on_a_full_disk_says_so_and_queues_again_once_there_is_room(
        tmp_path: Path, small_filesystem: Path):
    """``exporters.otlp.sending_queue.storage`` on a full filesystem (its backend down, so what is
    queued stays on disk): the start goes on, and ``/readyz`` is 503 naming the exporter and its
    directory (it stayed 200 while every kept trace was dropped ``storage_error``); once space
    returns, ``/readyz`` is 200 again and kept traces are written to the queue."""
    queue = small_filesystem / "queue"
    config = {
        "processors": SAMPLING,
        "exporters": {"otlp": {"endpoint": "127.0.0.1:9", "tls": {"insecure": True},
                               "sending_queue": {"storage": str(queue)}}},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"],
                                             "processors": ["memory_limiter", "llm_metrics", "tail_sampling", "redaction"],
                                             "exporters": ["store", "otlp", "prometheus"]}}},
    }
    queue.mkdir()
    server, filler = _start_full(tmp_path, small_filesystem, config)
    try:
        status, body = _readyz(server)
        assert status == 503 and "exporters.otlp" in body and str(queue) in body, body
        _post(server, vllm_batch(2))
        # The two kept traces, with the segment spans synthesized under their engine spans.
        scrape = server.wait_until(
            lambda s: s.value("otel_llm_exporter_dropped_spans_total", reason="storage_error") > 2,
            what="the kept spans the full queue could not take, counted")
        assert scrape.value("otel_llm_exporter_enqueued_spans_total") == 0
        filler.unlink()
        _ready_again(server)
        _post(server, vllm_batch(2))
        poll(lambda: len(list(queue.glob("*.otlpq"))) >= 1, 30, "a kept trace queued on disk again")
    finally:
        server.ensure_stopped()
