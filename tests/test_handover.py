"""The handover file read as untrusted input, written safely, and covered by the intake log (issue 50, item 4).

A real ``otel-llm serve`` writes each handover (``hand_over_pending_traces: true``, a graceful stop with
traces pending); the damaged records and bad ids are added to that file as an attacker (or a disk)
would, in the file's own framing. Every wait polls ``/metrics``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.exporter.store.sqlite import StoreReader
from otel_llm.receiver.otlp.carried import frame, frames
from tests.support.otelllm import ServerProcess
from tests.support.payloads import vllm_batch
from tests.test_intake_log import GroupServer
from tests.test_trace_assembly import _post

KEEP_ALL = [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]


def _config(hand_over: bool, intake_log: dict[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {
        # Long: what is taken over stays pending until the test has looked (or the stop decides it).
        "processors": {"tail_sampling": {"decision_wait": "120s", "grace": "100ms", "policies": KEEP_ALL}},
        "service": {"hand_over_pending_traces": hand_over}}
    if intake_log is not None:
        config["receivers"] = {"otlp": {"intake_log": intake_log}}
    return config


def _hand_over(tmp_path: Path, requests: list[ExportTraceServiceRequest]) -> Path:
    """A real stop's handover of ``requests``' traces (each pending: its engine span waits for a parent)."""
    server = ServerProcess(tmp_path, _config(hand_over=True))
    try:
        server.start()
        for request in requests:
            _post(server, request)
        spans = sum(len(scope.spans) for request in requests for resource_spans in request.resource_spans
                    for scope in resource_spans.scope_spans)
        server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == spans
                          and s.value("otel_llm_intake_queued_spans") == 0, what="buffered")
        assert server.stop() == 0
    finally:
        server.ensure_stopped()
    handover = tmp_path / "store" / "handover"
    assert handover.exists()
    return handover


def test_a_record_that_does_not_decode_is_counted_and_the_rest_are_taken_over(tmp_path: Path):
    """A record whose CRC is right over bytes that are no OTLP request (the issue's case: the start
    exited 1, and the records after it were lost uncounted) is counted damaged and skipped: the start
    goes on and takes over the records before and after it."""
    handover = _hand_over(tmp_path, [vllm_batch(1, parent=True), vllm_batch(1, parent=True)])
    good, damaged, _ = frames(handover.read_bytes())
    assert len(good) == 2 and not damaged
    not_a_request = b"\xff" * 40  # a valid frame around a tag longer than a varint can be: protobuf refuses it
    handover.write_bytes(frame(good[0]) + frame(not_a_request) + frame(good[1]))

    server = ServerProcess(tmp_path, _config(hand_over=False))
    try:
        server.start()
        scrape = server.scrape()
        assert scrape.value("otel_llm_handover_damaged_records_total") == 1
        assert scrape.value("otel_llm_spans_taken_over_total") == 2
        assert scrape.value("otel_llm_traces_in_memory") == 2
        assert not handover.exists()
        assert server.stop() == 0
    finally:
        server.ensure_stopped()


def test_taken_over_spans_go_through_the_receivers_id_checks(tmp_path: Path):
    """Spans with an empty or all-zero trace id, an all-zero span id or a parent id of the wrong
    length (which a receiver refuses) are dropped at take-over and counted; the valid one is taken."""
    handover = _hand_over(tmp_path, [vllm_batch(1, parent=True)])
    (good,), _, _ = frames(handover.read_bytes())
    bad = vllm_batch(4, parent=True)
    spans = bad.resource_spans[0].scope_spans[0].spans
    spans[0].trace_id = b""
    spans[1].trace_id = bytes(16)
    spans[2].span_id = bytes(8)
    spans[3].parent_span_id = b"\x01\x02\x03"
    handover.write_bytes(frame(good) + frame(bad.SerializeToString()))

    server = ServerProcess(tmp_path, _config(hand_over=False))
    try:
        server.start()
        scrape = server.scrape()
        assert scrape.value("otel_llm_spans_dropped_total", reason="invalid_id") == 4
        assert scrape.value("otel_llm_spans_taken_over_total") == 1
        assert scrape.value("otel_llm_traces_in_memory") == 1
        assert scrape.value("otel_llm_handover_damaged_records_total") == 0
        assert server.stop() == 0
    finally:
        server.ensure_stopped()


def test_a_planted_temporary_symlink_is_not_followed(tmp_path: Path):
    """``handover.tmp`` planted as a symlink to another file: the stop used to open it with O_TRUNC and
    overwrite the link's target. Now the link is removed (its target untouched), the handover is
    written to a file of its own, and the next start takes it over."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours to overwrite\n")
    planted = tmp_path / "store" / "handover.tmp"
    server = ServerProcess(tmp_path, _config(hand_over=True))
    try:
        server.start()
        _post(server, vllm_batch(1, parent=True))
        server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 1, what="pending")
        planted.symlink_to(victim)
        assert server.stop() == 0
    finally:
        server.ensure_stopped()
    assert victim.read_bytes() == b"not yours to overwrite\n"
    handover = tmp_path / "store" / "handover"
    assert not handover.is_symlink() and len(frames(handover.read_bytes())[0]) == 1
    assert not os.path.lexists(planted)


def test_traces_taken_over_survive_a_crash_right_after_with_the_intake_log(tmp_path: Path):
    """With ``receivers.otlp.intake_log`` on, the traces taken over are written to the log's carried
    file before the handover is deleted: a SIGKILL of the new process group before they are decided
    loses none of them (it lost all of them: the handover was gone and the log had never seen them)."""
    pending = vllm_batch(3, parent=True)
    _hand_over(tmp_path, [pending])
    first = GroupServer(tmp_path, _config(hand_over=False, intake_log={}))
    servers = [first]
    try:
        first.start()  # ready once the traces are taken over (and carried)
        assert first.scrape().value("otel_llm_spans_taken_over_total") == 3
        assert not (tmp_path / "store" / "handover").exists()
        first.kill_group()

        second = GroupServer(tmp_path, _config(hand_over=False, intake_log={}))
        servers.append(second)
        second.start()
        scrape = second.scrape()
        assert scrape.value("otel_llm_traces_in_memory") == 3, "the traces taken over were lost in the crash"
        assert scrape.value("otel_llm_intake_log_replayed_carried_traces_total") == 3
        assert second.stop() == 0  # decided at stop: measured once
        stored = [row["span_id"] for row in StoreReader(tmp_path / "store").list_requests(limit=100)]
        assert sorted(stored) == sorted(span.span_id.hex() for span in pending.resource_spans[0].scope_spans[0].spans)
    finally:
        for server in servers:
            server.ensure_stopped()
