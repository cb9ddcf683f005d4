"""The crash-safe intake (``receivers.otlp.intake_log``): what was answered 200 survives a SIGKILL
of the whole process group, is counted exactly once, and a full log refuses retryably, counted.

``otel-llm serve`` runs as a process group of its own (the pipeline process and its receiver
process); the spans are made by the OpenTelemetry SDK and sent by its OTLP/gRPC exporter, whose
``SUCCESS`` is the server's acknowledgement. Every wait polls a condition on ``/metrics`` or the
store; none sleeps for a machine-dependent time."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context

from otel_llm.receiver.otlp.carried import CarriedFile, CarriedSpans, frame
from otel_llm.receiver.otlp.intake_log import (
    LOG_FULL,
    SEGMENT_PREFIX,
    IntakeLogKeeper,
    IntakeLogSettings,
    IntakeLogShared,
    IntakeLogWriter,
)
from otel_llm.receiver.otlp.process import spawn_context
from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.otelllm import ServerProcess
from tests.support.payloads import vllm_batch
from tests.test_bad_input import http_post
from tests.test_receiver_process import EXPORT, alive, child_processes, poll

KEEP_ALL = [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]
LATENCIES = {"gen_ai.latency.time_to_first_token": 0.5, "gen_ai.latency.time_in_queue": 0.1,
             "gen_ai.latency.time_in_model_prefill": 0.3, "gen_ai.latency.time_in_model_decode": 2.0,
             "gen_ai.latency.e2e": 2.6, "gen_ai.latency.time_in_model_inference": 2.3}


class GroupServer(ServerProcess):
    """``otel-llm serve`` in a session (process group) of its own, so that one ``killpg`` SIGKILLs
    the pipeline process and its receiver process at the same instant."""

    new_session = True

    def start(self, timeout_s: float = 30.0, degraded: bool = False) -> None:
        super().start(timeout_s, degraded)

    def kill_group(self) -> None:
        assert self.process is not None
        receiver = child_processes(self.process.pid)["otel-llm-recv"]
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        poll(lambda: not alive(receiver), 10, "the receiver process to die with its group")

    def ensure_stopped(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def server_config(intake_log: dict[str, Any] | None, decision_wait: str) -> dict[str, Any]:
    config: dict[str, Any] = {"processors": {"tail_sampling": {"decision_wait": decision_wait, "grace": "100ms",
                                                               "policies": KEEP_ALL}}}
    if intake_log is not None:
        config["receivers"] = {"otlp": {"intake_log": intake_log}}
    return config


def vllm_spans(model: str, rooted: int, unrooted: int) -> list[ReadableSpan]:
    """vLLM V1 ``llm_request`` spans made by the SDK: ``rooted`` complete traces (decided after
    ``grace``) and ``unrooted`` ones whose parent never comes (held until ``decision_wait``)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm-crash"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("vllm.tracing.otel")
    start = time.time_ns()
    for index in range(rooted + unrooted):
        context = None
        if index >= rooted:
            parent = SpanContext(trace_id=random.getrandbits(128) | 1, span_id=random.getrandbits(64) | 1,
                                 is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
            context = set_span_in_context(NonRecordingSpan(parent))
        name = f"{model}-rooted" if index < rooted else f"{model}-unrooted"
        span = tracer.start_span("llm_request", context=context, kind=SpanKind.SERVER, start_time=start,
                                 attributes={**LATENCIES, "gen_ai.response.model": name,
                                             "gen_ai.usage.prompt_tokens": 100, "gen_ai.usage.completion_tokens": 51})
        span.end(end_time=start + int(2.6e9))
    provider.shutdown()
    return list(memory.get_finished_spans())


def send(server: ServerProcess, requests: int, model: str, rooted: int, unrooted: int, protocol: str = "grpc") -> int:
    """``requests`` Export calls through the SDK's OTLP exporter; returns the spans acknowledged."""
    exporter: OTLPSpanExporter | HttpSpanExporter
    if protocol == "grpc":
        exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True, timeout=10)
    else:
        exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/traces", timeout=10)
    acknowledged = 0
    try:
        for _ in range(requests):
            spans = vllm_spans(model, rooted, unrooted)
            assert exporter.export(spans) == SpanExportResult.SUCCESS
            acknowledged += len(spans)
    finally:
        exporter.shutdown()
    return acknowledged


def count(scrape, model: str) -> float:  # noqa: ANN001
    return scrape.value("vllm:e2e_request_latency_seconds_count", model_name=model)


def stored(store: Path, model: str) -> int:
    return len(StoreReader(store).list_requests(model=model, limit=100_000))


def segments(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith(SEGMENT_PREFIX)) if directory.exists() else []


@pytest.mark.parametrize("intake_log,protocol", [
    ({}, "grpc"), ({"fsync": "always"}, "grpc"), ({"fsync": "never"}, "http"),
    (None, "grpc")], ids=["log-interval", "log-always", "log-never-http", "no-log"])
def test_sigkill_of_the_process_group_loses_nothing_acknowledged(tmp_path: Path, intake_log: dict | None,
                                                                 protocol: str):
    """20 requests of 5 pending traces each, every one answered SUCCESS and buffered; SIGKILL of the
    whole process group while all 100 wait for their decision; a restart on the same directory. With
    the log, each of the 100 traces reaches the metrics and the store exactly once. Without it, all
    100 are lost: the default's exposure (everything between the answer and the decision)."""
    store = tmp_path / "store"
    first = GroupServer(tmp_path, server_config(intake_log, decision_wait="60s"))
    second = None
    try:
        first.start()
        acknowledged = send(first, 20, "crash", rooted=0, unrooted=5, protocol=protocol)
        assert acknowledged == 100
        first.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 100, what="100 traces pending")
        assert count(first.scrape(), "crash-unrooted") == 0  # nothing decided yet: decision_wait is 60 s
        first.kill_group()

        # Same directory; decision_wait 1s only so that the replayed traces are decided soon.
        second = GroupServer(tmp_path, server_config(intake_log, decision_wait="1s"))
        second.start()
        if intake_log is None:
            scrape = second.scrape()
            assert scrape.value("otel_llm_traces_in_memory") == 0 and count(scrape, "crash-unrooted") == 0
            assert second.stop() == 0  # a graceful stop decides and stores whatever it held: nothing
            assert stored(store, "crash-unrooted") == 0, "without the log, a SIGKILL loses every pending trace"
            return
        scrape = second.wait_until(lambda s: count(s, "crash-unrooted") >= 100 and
                                   s.value("otel_llm_traces_in_memory") == 0, what="the replayed traces decided")
        assert count(scrape, "crash-unrooted") == acknowledged
        assert scrape.value("otel_llm_intake_log_replayed_requests_total") == 20
        assert scrape.value("otel_llm_intake_log_replayed_spans_total") == acknowledged
        poll(lambda: stored(store, "crash-unrooted") >= acknowledged, 30, "the replayed traces stored")
        assert second.stop() == 0
        assert stored(store, "crash-unrooted") == acknowledged
        assert segments(store / "intake-log") == [], "a graceful stop leaves nothing to replay"
    finally:
        first.ensure_stopped()
        if second is not None:
            second.ensure_stopped()


def test_replay_counts_each_request_once(tmp_path: Path):
    """Each request carries 3 traces decided within ``grace`` and 3 that wait for ``decision_wait``:
    at the SIGKILL every request is still in the log (its pending traces hold it) although half its
    traces were measured and stored. The restart measures only the other half (the decision journal);
    the first half is stored once; and a graceful stop then leaves nothing to replay again."""
    store = tmp_path / "store"
    first = GroupServer(tmp_path, server_config({}, decision_wait="60s"))
    servers = [first]
    try:
        first.start()
        assert send(first, 20, "mixed", rooted=3, unrooted=3) == 120
        scrape = first.wait_until(lambda s: count(s, "mixed-rooted") == 60 and s.value("otel_llm_traces_in_memory") == 60,
                                  what="the rooted traces decided, the others pending")
        assert count(scrape, "mixed-unrooted") == 0
        poll(lambda: stored(store, "mixed-rooted") == 60, 30, "the decided traces stored")
        assert scrape.value("otel_llm_intake_log_pending_requests") == 20  # none handled: each holds a pending trace
        first.kill_group()

        second = GroupServer(tmp_path, server_config({}, decision_wait="1s"))
        servers.append(second)
        second.start()
        scrape = second.wait_until(lambda s: count(s, "mixed-unrooted") >= 60 and s.value("otel_llm_traces_in_memory") == 0
                                   and s.value("otel_llm_intake_queued_spans") == 0, what="the replay decided")
        assert scrape.value("otel_llm_intake_log_replayed_requests_total") == 20
        assert count(scrape, "mixed-unrooted") == 60
        assert count(scrape, "mixed-rooted") == 0, "measured before the crash: not measured again"
        assert scrape.value("otel_llm_sampling_decisions_total") == 60  # only the pending ones decided anew
        poll(lambda: stored(store, "mixed-unrooted") == 60, 30, "the replayed traces stored")
        assert stored(store, "mixed-rooted") == 60  # delivered again, stored once
        assert second.stop() == 0

        third = GroupServer(tmp_path, server_config({}, decision_wait="1s"))
        servers.append(third)
        third.start()
        assert third.scrape().value("otel_llm_intake_log_replayed_requests_total") == 0
        assert third.stop() == 0
        assert (stored(store, "mixed-rooted"), stored(store, "mixed-unrooted")) == (60, 60)
    finally:
        for server in servers:
            server.ensure_stopped()


def test_a_full_log_refuses_retryably_and_counts_it(make_server):
    """A 2 MiB log whose requests wait for a 60 s decision fills: the next Export is refused with
    gRPC UNAVAILABLE and a RetryInfo, HTTP 429 with Retry-After, counted by reason; what was
    acknowledged is all in the pipeline, and the log stays within its bound."""
    server = make_server({
        "receivers": {"otlp": {"intake_log": {"max_size_mib": 2, "segment_size_mib": 1}}},
        "processors": {"tail_sampling": {"decision_wait": "60s"}},
    })
    payload = vllm_batch(400, parent=True).SerializeToString()
    acknowledged = 0
    refusal = None
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT)
        for _ in range(100):
            try:
                export(vllm_batch(400, parent=True).SerializeToString(), timeout=10)
            except grpc.RpcError as exc:
                refusal = exc
                break
            acknowledged += 400
    assert refusal is not None, "2 MiB hold fewer than 100 requests of ~100 KB"
    assert refusal.code() == grpc.StatusCode.UNAVAILABLE
    assert "intake_log_full" in refusal.details()
    assert any(key == "grpc-status-details-bin" for key, _ in refusal.trailing_metadata())  # RetryInfo
    status, _, headers = http_post(server, payload)
    assert (status, headers["Retry-After"]) == (429, "1")
    scrape = server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == acknowledged, what="acknowledged buffered")
    assert scrape.value("otel_llm_intake_log_refused_requests_total", reason="full") == 2
    assert scrape.value("otel_llm_receiver_refused_spans_total", reason="intake_log_full") == 800
    assert scrape.value("otel_llm_receiver_refused_requests_total", reason="intake_log_full") == 2
    assert scrape.value("otel_llm_receiver_accepted_spans_total") == acknowledged
    assert 0 < scrape.value("otel_llm_intake_log_size_bytes") <= 2 << 20
    assert scrape.value("otel_llm_intake_log_appended_requests_total") == acknowledged // 400


def test_the_log_frees_room_once_handled_and_replays_only_the_rest(tmp_path: Path):
    """The writer and the keeper in one process: the log fills (refused), the keeper checkpoints the
    requests handled and deletes the segments they filled (room again); a restart replays only the
    requests after the checkpoint; a torn last record (a write the crash cut) is skipped and counted."""
    context = spawn_context()
    shared = IntakeLogShared(context)
    settings = IntakeLogSettings(str(tmp_path), fsync="never", segment_bytes=64 << 10, max_bytes=256 << 10)
    keeper = IntakeLogKeeper(settings, shared, decision_wait_s=0.0)
    assert list(keeper.recover()) == []
    writer = IntakeLogWriter(keeper.receiver_settings(), shared)
    payload = os.urandom(20_000)
    seqs = []
    while True:
        refused, seq = writer.append(7, payload)
        if refused:
            assert refused == LOG_FULL
            break
        seqs.append(seq)
        keeper.arrived()
    assert len(seqs) >= 10 and shared[IntakeLogShared.REFUSED_FULL] == 1
    handled = len(seqs) // 2
    for _ in seqs[:handled]:
        keeper.processed()
    keeper.ticked(time.monotonic() + 1)  # those are handled now (decision_wait 0)
    assert keeper.checkpoint() == handled
    assert shared[IntakeLogShared.SIZE] < 256 << 10
    refused, seq = writer.append(7, payload)
    assert (refused, seq) == ("", len(seqs) + 1), "room again once handled segments are deleted"
    writer.close()
    keeper.close()  # what was not handled stays
    last = segments(tmp_path)[-1]
    with open(last, "ab") as f:  # a record the crash cut in the middle
        f.write(b"\x10\x00\x00\x00" + b"torn")

    again = IntakeLogKeeper(settings, IntakeLogShared(context), decision_wait_s=0.0)
    replayed = [record.seq for record in again.recover()]
    assert replayed == list(range(handled + 1, len(seqs) + 2))
    assert again.corrupt_segments == 1 and again.replayed_spans == 7 * len(replayed)
    assert again.receiver_settings().start_seq == len(seqs) + 2


@pytest.mark.parametrize("intake_log,path", [
    ({"fsync": "sometimes"}, "receivers.otlp.intake_log.fsync"),
    ({"fsync_interval": "0s"}, "receivers.otlp.intake_log.fsync_interval"),
    ({"max_size_mib": 16, "segment_size_mib": 16}, "receivers.otlp.intake_log.segment_size_mib"),
    ({"max_size_mib": 0}, "receivers.otlp.intake_log.max_size_mib"),
    ({"colour": "blue"}, "receivers.otlp.intake_log.colour"),
    ({"min_free_mib": -1}, "receivers.otlp.intake_log.min_free_mib"),
])
def test_intake_log_options_are_validated_with_their_path(intake_log: dict, path: str):
    from otel_llm.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError) as info:
        config_from_dict({"receivers": {"otlp": {"intake_log": intake_log}}})
    assert info.value.path == path


def test_the_intake_log_is_off_by_default_and_needs_a_directory_without_a_store():
    from otel_llm.config import ConfigError, config_from_dict, intake_log_directory

    default = config_from_dict({})
    assert default.receivers.otlp is not None and default.receivers.otlp.intake_log is None
    on = config_from_dict({"receivers": {"otlp": {"intake_log": None}}})  # `intake_log:` alone: on, defaults
    assert intake_log_directory(on) == "otel-llm-data/intake-log"
    with pytest.raises(ConfigError) as info:
        config_from_dict({"receivers": {"otlp": {"intake_log": {}}}, "exporters": {"prometheus": {}}})
    assert info.value.path == "receivers.otlp.intake_log.directory"


def test_a_crash_during_the_replay_still_counts_each_request_once(tmp_path: Path):
    """SIGKILL, restart, SIGKILL again once the replay is buffered (the replayed traces pending again,
    the rooted ones re-completed without being measured), restart: the previous runs' decisions are
    still in the journal, so the rooted half is still not measured again and the rest is not lost."""
    store = tmp_path / "store"
    servers = []
    try:
        for run in range(3):
            server = GroupServer(tmp_path, server_config({}, decision_wait="1s" if run == 2 else "60s"))
            servers.append(server)
            server.start()
            if run == 0:
                assert send(server, 10, "twice", rooted=2, unrooted=2) == 40
            else:
                assert server.scrape().value("otel_llm_intake_log_replayed_requests_total") == 10
            if run < 2:
                scrape = server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 20 and
                                           s.value("otel_llm_intake_queued_spans") == 0 and
                                           s.value("otel_llm_traces_completed_total") == 20, what="20 decided, 20 pending")
                assert count(scrape, "twice-rooted") == (20 if run == 0 else 0)
                server.kill_group()
        scrape = server.wait_until(lambda s: count(s, "twice-unrooted") >= 20 and s.value("otel_llm_traces_in_memory") == 0,
                                   what="the second replay decided")
        assert (count(scrape, "twice-rooted"), count(scrape, "twice-unrooted")) == (0, 20)
        assert server.stop() == 0
        assert (stored(store, "twice-rooted"), stored(store, "twice-unrooted")) == (20, 20)
    finally:
        for server in servers:
            server.ensure_stopped()


# --- damage, bad checkpoints, full disks (issue 24: High 4, Medium 5, 6, 7) ----------------------------

def _keeper_and_writer(directory: Path, **settings: Any) -> tuple[IntakeLogKeeper, IntakeLogWriter, IntakeLogShared]:
    shared = IntakeLogShared(spawn_context())
    keeper = IntakeLogKeeper(IntakeLogSettings(str(directory), **{"fsync": "never", "min_free_bytes": 0, **settings}),
                             shared, decision_wait_s=0.0)
    list(keeper.recover())
    return keeper, IntakeLogWriter(keeper.receiver_settings(), shared), shared


def _reopen(directory: Path, **settings: Any) -> tuple[IntakeLogKeeper, list[int]]:
    keeper = IntakeLogKeeper(IntakeLogSettings(str(directory), **{"fsync": "never", "min_free_bytes": 0, **settings}),
                             IntakeLogShared(spawn_context()), decision_wait_s=0.0)
    return keeper, [record.seq for record in keeper.recover()]


def test_one_flipped_byte_costs_that_record_only(tmp_path: Path):
    """100 records, one byte of record 10's payload flipped (damage after a machine crash): the
    reading resumes at record 11, so 99 are replayed and the damaged one is counted."""
    keeper, writer, _ = _keeper_and_writer(tmp_path)
    payloads = [os.urandom(300 + index) for index in range(100)]
    for payload in payloads:
        assert writer.append(3, payload)[0] == ""
    writer.close()
    keeper.close()
    (segment,) = segments(tmp_path)
    data = bytearray(segment.read_bytes())
    offset = sum(24 + len(p) for p in payloads[:9]) + 24 + 5  # 5 bytes into record 10's payload
    data[offset] ^= 0xFF
    segment.write_bytes(bytes(data))

    again, replayed = _reopen(tmp_path)
    assert replayed == [seq for seq in range(1, 101) if seq != 10]
    assert (again.corrupt_segments, again.corrupt_records) == (1, 1)
    again.close()


def test_a_torn_first_record_never_has_the_next_run_append_behind_it(tmp_path: Path):
    """The first record of a segment torn by a crash: the next run's writer starts a segment of the
    same name. Its records are not written behind the garbage (which is cut), so a crash of that
    run replays every one of them."""
    keeper, writer, _ = _keeper_and_writer(tmp_path)
    writer.close()
    keeper.close()
    (segment,) = segments(tmp_path) or [tmp_path / "intake-00000000000000000001.wal"]
    segment.write_bytes(b"\x00\x10\x00\x00" + b"torn" * 5)  # 24 bytes of a header promising 4 KiB

    keeper, writer, _ = _keeper_and_writer(tmp_path)
    assert keeper.corrupt_segments == 1
    seqs = [writer.append(2, os.urandom(200))[1] for _ in range(50)]
    writer.close()  # a crash: nothing handled, nothing checkpointed
    os.close(keeper._keeper_lock)  # what the kernel does for a killed process
    again, replayed = _reopen(tmp_path)
    assert replayed == seqs and len(seqs) == 50
    assert again.corrupt_segments == 0, "the garbage was cut the first time"
    again.close()


@pytest.mark.parametrize("content", [b"", b"\x00" * 20, b"garbage that is not a checkpoint"], ids=["empty", "zeros", "text"])
def test_a_bad_checkpoint_is_rebuilt_from_the_segments(tmp_path: Path, content: bytes):
    """An empty or garbage checkpoint never stops a start: it is rebuilt from the oldest segment
    left (everything in the segments is replayed), counted, and written again."""
    keeper, writer, _ = _keeper_and_writer(tmp_path, segment_bytes=4096)
    for _ in range(20):
        assert writer.append(1, os.urandom(1000))[0] == ""
        keeper.arrived()
    for _ in range(8):
        keeper.processed()
    keeper.ticked(time.monotonic() + 1)
    assert keeper.checkpoint() == 8
    writer.close()
    keeper.close()
    oldest = int(segments(tmp_path)[0].name[len(SEGMENT_PREFIX):-4])
    assert 1 < oldest <= 9
    (tmp_path / "checkpoint").write_bytes(content)

    again, replayed = _reopen(tmp_path)
    assert replayed == list(range(oldest, 21))
    assert again.checkpoints_rebuilt == 1
    again.close()
    third, replayed = _reopen(tmp_path)
    assert third.checkpoints_rebuilt == 0 and replayed == list(range(oldest, 21))
    third.close()


def test_fsync_interval_syncs_the_checkpoint(tmp_path: Path):
    """With ``fsync: interval`` the checkpoint file is written with fdatasync too (counted)."""
    keeper, writer, _ = _keeper_and_writer(tmp_path, fsync="interval", fsync_interval_s=3600.0)
    for _ in range(3):
        writer.append(1, b"x" * 100)
        keeper.arrived()
    for _ in range(3):
        keeper.processed()
    keeper.ticked(time.monotonic() + 1)
    before = keeper.pipeline_fsyncs
    assert keeper.checkpoint() == 3
    assert keeper.pipeline_fsyncs == before + 1  # the journal's own is due only every fsync_interval
    writer.close()
    keeper.close()


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem (tmpfs, mounted as root), so that a full disk is a real ENOSPC."""
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a 4 MiB tmpfs (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> None:
    """Write zeros into ``path`` until the filesystem says ENOSPC."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = bytes(4096)
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return
    finally:
        os.close(fd)


def _readyz(server: Any) -> int:
    try:
        with urllib.request.urlopen(f"{server.metrics_url}/readyz", timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _export(export: Any, spans: int) -> grpc.RpcError | None:
    try:
        export(vllm_batch(spans, model="disk").SerializeToString(), timeout=10)
    except grpc.RpcError as exc:
        return exc
    return None


def test_a_full_disk_refuses_retryably_and_the_log_recovers_by_itself(small_filesystem: Path, make_server):
    """The intake log's filesystem filled by someone else (a real ENOSPC): no thread dies; requests
    are refused with a retryable code (gRPC UNAVAILABLE, HTTP 503 + Retry-After), the write errors
    are counted by reason and /readyz is 503; once the space is back, the log takes requests again
    by itself, /readyz is 200, and every acknowledged span is measured."""
    server = make_server({
        "receivers": {"otlp": {"intake_log": {"directory": str(small_filesystem / "log"), "min_free_mib": 0,
                                              "segment_size_mib": 1, "max_size_mib": 64}}},
        "processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms", "policies": KEEP_ALL}},
    })
    acknowledged = 0
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT)
        for _ in range(5):
            assert _export(export, 20) is None
            acknowledged += 20
        server.wait_until(lambda s: s.value("vllm:e2e_request_latency_seconds_count") == acknowledged,
                          what="the first requests measured")
        filler = small_filesystem / "filler"
        _fill(filler)
        refusal = _export(export, 20)
        assert refusal is not None and refusal.code() == grpc.StatusCode.UNAVAILABLE, refusal
        assert "intake_log_error" in refusal.details()
        status, _, headers = http_post(server, vllm_batch(20, model="disk").SerializeToString())
        assert (status, headers["Retry-After"]) == (503, "5")
        assert _readyz(server) == 503
        # Traces decided while the disk is full: their journal entries wait (the keeper's writes fail too).
        for _ in range(3):
            _export(export, 20)
        scrape = server.wait_until(lambda s: s.value("otel_llm_intake_log_write_errors_total", file="segment",
                                                     reason="no_space") >= 1, what="the segment write error counted")
        assert scrape.value("otel_llm_intake_log_writable") == 0
        assert scrape.value("otel_llm_receiver_refused_requests_total", reason="intake_log_error") >= 2

        filler.unlink()
        deadline = time.monotonic() + 30
        while (refusal := _export(export, 20)) is not None:
            assert time.monotonic() < deadline, f"still refused 30 s after the space came back: {refusal.details()}"
            time.sleep(0.2)
        acknowledged += 20
        for _ in range(5):
            assert _export(export, 20) is None
            acknowledged += 20
    poll(lambda: _readyz(server) == 200, 30, "/readyz 200 again")
    scrape = server.wait_until(lambda s: s.value("vllm:e2e_request_latency_seconds_count") == acknowledged
                               and s.value("otel_llm_traces_in_memory") == 0
                               and s.value("otel_llm_intake_log_pending_requests") == 0,
                               timeout_s=60, what="every acknowledged span measured, the log handled")
    assert scrape.value("otel_llm_intake_log_writable") == 1
    assert scrape.value("otel_llm_receiver_accepted_spans_total") == acknowledged


def test_a_log_that_would_fill_its_filesystem_stops_at_the_floor_and_frees_itself(small_filesystem: Path, make_server):
    """A log whose max_size is above its 4 MiB filesystem stops at the free-space floor
    (``min_free_mib``: refused retryably, counted ``low_disk``), never fills the filesystem, and
    frees itself once its requests are handled: 30 requests later are all accepted."""
    directory = small_filesystem / "log"
    server = make_server({
        "receivers": {"otlp": {"intake_log": {"directory": str(directory), "min_free_mib": 1,
                                              "segment_size_mib": 1, "max_size_mib": 1024}}},
        # A request stays in the log decision_wait after it is processed: 10 s of requests fill 3 MiB
        # even at the rate a loaded 2-core machine sends them.
        "processors": {"tail_sampling": {"decision_wait": "10s", "grace": "100ms", "policies": KEEP_ALL}},
    })
    acknowledged = 0
    refusal = None
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT)
        for _ in range(500):  # ~25 KB each: 4 MiB hold fewer than 200
            refusal = _export(export, 100)
            if refusal is not None:
                break
            acknowledged += 100
        assert refusal is not None and refusal.code() == grpc.StatusCode.UNAVAILABLE
        assert "intake_log_full" in refusal.details()
        stat = os.statvfs(small_filesystem)
        assert stat.f_bavail * stat.f_frsize >= 1 << 20, "the floor is left free"
        scrape = server.scrape()
        assert scrape.value("otel_llm_intake_log_refused_requests_total", reason="low_disk") >= 1
        assert scrape.value("otel_llm_intake_log_write_errors_total") == 0
        server.wait_until(lambda s: s.value("otel_llm_intake_log_pending_requests") == 0
                          and s.value("vllm:e2e_request_latency_seconds_count") == acknowledged,
                          timeout_s=60, what="the log handled and freed")
        refused = sum(_export(export, 100) is not None for _ in range(30))
    assert refused == 0
    assert _readyz(server) == 200


def test_serve_starts_on_a_garbage_checkpoint(tmp_path: Path):
    """``otel-llm serve`` with an intake log whose checkpoint is garbage (it refused to start: a crash
    loop) starts, rebuilds the checkpoint from the segments (counted) and replays what they hold."""
    first = GroupServer(tmp_path, server_config({}, decision_wait="60s"))
    servers = [first]
    try:
        first.start()
        assert send(first, 4, "garbage", rooted=0, unrooted=2) == 8
        first.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 8, what="buffered")
        first.kill_group()
        (tmp_path / "store" / "intake-log" / "checkpoint").write_bytes(b"not a checkpoint at all")
        second = GroupServer(tmp_path, server_config({}, decision_wait="1s"))
        servers.append(second)
        second.start()
        scrape = second.wait_until(lambda s: count(s, "garbage-unrooted") == 8, what="the log replayed")
        assert scrape.value("otel_llm_intake_log_checkpoint_rebuilds_total") == 1
        assert scrape.value("otel_llm_intake_log_replayed_requests_total") == 4
        assert second.stop() == 0
    finally:
        for server in servers:
            server.ensure_stopped()


# --- a held call does not pin the log (issue 50, item 3) ---------------------------------------------

def _log_bytes(directory: Path) -> int:
    """Everything the intake log keeps on disk: segments, the held traces' file, journals, checkpoint."""
    return sum(path.stat().st_size for path in directory.iterdir() if path.is_file()) if directory.exists() else 0


def test_a_held_call_does_not_pin_the_log_and_survives_a_sigkill(tmp_path: Path):
    """A GenAI client's HTTP span whose caller's span has not come (a call in flight, held up to
    ``max_open_call_wait``) used to keep every later request in the log: 24 MiB of traffic behind it
    stayed on disk (issue 50: 10.5-11.6 MiB measured). Now its spans are carried past the checkpoint
    in a file of their own, so the log shrinks to about one segment once ``decision_wait`` has passed;
    and a SIGKILL of the whole group still loses neither the held trace nor any acknowledged request:
    the restart holds the HTTP span again, and the caller's span and the engine's sent then join it."""
    from tests.unit.service.test_long_calls import Call

    config = server_config({"segment_size_mib": 1, "max_size_mib": 256}, decision_wait="1s")
    # Only errors kept (the call's): the 100 000 spans behind it are measured, not stored.
    config["processors"]["tail_sampling"].update(max_open_call_wait="10m",
                                                  policies=[{"name": "errors", "type": "errors"}])
    log_directory = tmp_path / "store" / "intake-log"
    call = Call("held-across-a-crash", error="RateLimitError")
    first = GroupServer(tmp_path, config)
    servers = [first]
    try:
        first.start()
        with grpc.insecure_channel(f"127.0.0.1:{first.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT)
            export(call.http.SerializeToString(), timeout=10)
            first.wait_until(lambda s: s.value("otel_llm_traces_held_open_calls") == 1, what="the call held")
            acknowledged = 0
            while first.scrape().value("otel_llm_intake_log_appended_bytes_total") < 24 << 20:
                export(vllm_batch(400, model="behind-the-held-call").SerializeToString(), timeout=30)
                acknowledged += 400
        first.wait_until(lambda s: count(s, "behind-the-held-call") == acknowledged, timeout_s=120,
                         what="every request behind the held call measured")
        poll(lambda: _log_bytes(log_directory) <= 2 << 20, 60,
             f"the log back to about one segment (holds {_log_bytes(log_directory)} bytes)")
        scrape = first.scrape()
        assert scrape.value("otel_llm_traces_held_open_calls") == 1, "still held: the log no longer waits for it"
        assert scrape.value("otel_llm_intake_log_carried_traces") == 1
        first.kill_group()

        second = GroupServer(tmp_path, config)
        servers.append(second)
        second.start()
        second.wait_until(lambda s: s.value("otel_llm_traces_held_open_calls") == 1, what="the call held again")
        with grpc.insecure_channel(f"127.0.0.1:{second.grpc_port}") as channel:
            channel.unary_unary(EXPORT)(call.genai.SerializeToString(), timeout=10)
            channel.unary_unary(EXPORT)(call.engine.SerializeToString(), timeout=10)
        second.wait_until(lambda s: s.value("otel_llm_traces_held_open_calls") == 0
                          and s.value("otel_llm_traces_in_memory") == 0, what="the joined call decided")
        assert count(second.scrape(), "behind-the-held-call") == 0, "decided before the crash: not measured again"
        assert second.stop() == 0
        trace = StoreReader(tmp_path / "store").get_trace(call.trace.hex())
        assert trace is not None
        stored_ids = {span["span_id"] for span in trace["spans"]}
        assert {call.http_id.hex(), call.genai_id.hex()} <= stored_ids, "the held span came back after the SIGKILL"
    finally:
        for server in servers:
            server.ensure_stopped()


def _client_calls(count: int, rooted: bool) -> ExportTraceServiceRequest:
    """``count`` traces of an HTTP client's span whose caller's span has not come (a call in flight);
    ``rooted``: the callers' spans (same trace and span ids, seeded), which end those calls."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    kv = resource_spans.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "app"
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "opentelemetry.instrumentation.httpx"
    now = time.time_ns()
    for index in range(count):
        span = scope_spans.spans.add()
        span.trace_id = index.to_bytes(8, "big") + b"carried!"
        caller = index.to_bytes(7, "big") + b"\x01"
        span.span_id, span.parent_span_id = (caller, b"") if rooted else (index.to_bytes(7, "big") + b"\x02", caller)
        span.name = "chat" if rooted else "POST"
        span.kind = 3
        span.start_time_unix_nano, span.end_time_unix_nano = now, now + 1_000_000
    return request


def test_carried_traces_leave_the_carried_file_once_decided(make_server):
    """8 000 calls held (their callers' spans not come): their spans are carried; once the callers'
    spans come and the traces are decided, each gets a tombstone, and the file, all dead records,
    is rewritten empty."""
    server = make_server({
        "receivers": {"otlp": {"intake_log": {}}},
        "processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms", "max_open_call_wait": "10m"}},
    })
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT)
        export(_client_calls(8000, rooted=False).SerializeToString(), timeout=30)
        scrape = server.wait_until(lambda s: s.value("otel_llm_intake_log_carried_traces") == 8000, timeout_s=60,
                                   what="the held calls carried")
        assert scrape.value("otel_llm_traces_held_open_calls") == 8000
        assert scrape.value("otel_llm_intake_log_carried_bytes") > 1 << 20
        export(_client_calls(8000, rooted=True).SerializeToString(), timeout=30)
    # Dead records outweighing the live ones: the file is rewritten, empty.
    scrape = server.wait_until(lambda s: s.value("otel_llm_intake_log_carried_traces") == 0
                               and s.value("otel_llm_intake_log_carried_bytes") == 0, timeout_s=60,
                               what="decided, tombstoned, compacted")
    assert scrape.value("otel_llm_traces_in_memory") == 0
    assert scrape.value("otel_llm_traces_completed_total") == 8000


def test_the_carried_file_survives_an_append_a_crash_cut(tmp_path: Path):
    """Two traces carried, one of them left (tombstoned), then an append cut by a crash: the next
    start reads the live trace's spans, cuts the torn bytes (counted) so nothing is appended behind
    them, and what it appends next is read back by the start after it."""
    path = tmp_path / "carried.log"
    first, second = vllm_batch(2, parent=True), vllm_batch(1, parent=True)
    carried = CarriedFile(path, sync=False)
    for request in (first, second):
        spans = request.resource_spans[0].scope_spans[0].spans
        carried.append([CarriedSpans(spans[0].trace_id, request.SerializeToString(), {s.span_id for s in spans})], [])
    carried.append([], [second.resource_spans[0].scope_spans[0].spans[0].trace_id])
    with open(path, "ab") as file:
        file.write(frame(b"S" + bytes(16) + b"an append the crash cut")[:-5])

    again = CarriedFile(path, sync=False)
    requests, damaged = again.load()
    assert (requests, damaged) == ([first.SerializeToString()], 1)
    assert path.stat().st_size == again.size
    third = vllm_batch(1, parent=True)
    third_span = third.resource_spans[0].scope_spans[0].spans[0]
    again.append([CarriedSpans(third_span.trace_id, third.SerializeToString(), {third_span.span_id})], [])
    assert CarriedFile(path, sync=False).load() == ([first.SerializeToString(), third.SerializeToString()], 0)
