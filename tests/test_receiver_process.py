"""The receivers run in their own process: Export calls are answered while the pipeline is busy,
neither process outlives the other, and a dead receiver process stops the service loudly."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from otel_llm.config import HttpProtocol
from otel_llm.receiver.otlp.http import OtlpHttpReceiver
from otel_llm.receiver.otlp.process import (
    BATCH,
    BATCH_HEADER,
    VALIDATED,
    Forwarder,
    IntakeState,
    ReceiverCounters,
    is_done_event,
    spawn_context,
)
from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.otelllm import ServerProcess
from tests.support.payloads import vllm_batch
from tests.test_bad_input import http_post

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def child_processes(pid: int) -> dict[str, int]:
    """Child processes of ``pid`` by their name (/proc/PID/comm)."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(child) for child in f.read().split())
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    named = {}
    for child in found:
        try:
            named[Path(f"/proc/{child}/comm").read_text().strip()] = child
        except FileNotFoundError:  # exited meanwhile
            continue
    return named


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def poll(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class ForwarderRig:
    """A receiver process's forwarder, in this process, writing to a real pipe."""

    forwarder: Forwarder
    state: IntakeState
    counters: ReceiverCounters
    reader: Connection
    writer: Connection


def forwarder_rig() -> ForwarderRig:
    context = spawn_context()
    counters = ReceiverCounters(context)
    state = IntakeState(context, 10_000, 1 << 30)
    reader, writer = context.Pipe(duplex=False)
    forwarder = Forwarder(state, counters, writer)
    forwarder.start()
    return ForwarderRig(forwarder, state, counters, reader, writer)


def messages_until_closed(reader: Connection) -> list[bytes]:
    """Everything the forwarder sent down the pipe, once its writing end is closed."""
    messages = []
    while True:
        try:
            messages.append(reader.recv_bytes())
        except EOFError:
            return messages


def test_exports_are_answered_while_the_pipeline_is_stalled(make_server):
    """With the pipeline worker blocked, Export calls still get their answer in milliseconds (the
    spans wait in the intake), and once it resumes every admitted span is processed."""
    server = make_server()
    payloads = [vllm_batch(50, model="stalled").SerializeToString() for _ in range(41)]
    latencies = []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT)
        export(payloads[0], timeout=10)  # connection set up outside the measurement
        with server.service.pipeline.assembler._lock:
            for payload in payloads[1:]:
                start = time.perf_counter()
                export(payload, timeout=10)
                latencies.append(time.perf_counter() - start)
            queued = server.service.pipeline.intake.queued_spans  # /metrics would wait for the lock too
    assert queued >= 40 * 50 - 50, "the calls were answered, not processed"
    print(f"\nExport while the pipeline is stalled: median {statistics.median(latencies) * 1000:.1f} ms, "
          f"max {max(latencies) * 1000:.1f} ms")
    assert max(latencies) < 0.5, "answered without waiting for the stalled pipeline"
    scrape = server.wait_for_requests(41 * 50)
    assert scrape.value("vllm:e2e_request_latency_seconds_count", model_name="stalled") == 41 * 50
    assert scrape.value("otel_llm_intake_queued_spans") == 0


def test_ingest_processes_exit_with_a_killed_pipeline_process(tmp_path: Path):
    """SIGKILL leaves the pipeline process no chance to stop anything: the receiver process sees its
    control pipe close and exits, so the ports are free for the restart."""
    process = ServerProcess(tmp_path, {})
    process.start()
    names = {"otel-llm-recv"}
    try:
        assert process.process is not None
        children = child_processes(process.process.pid)
        assert names <= children.keys() and "otel-llm-adapt" not in children, children
        assert http_post(process, vllm_batch(5).SerializeToString())[0] == 200
        process.stop(signal.SIGKILL)
        for name in names:
            poll(lambda: not alive(children[name]), 10, f"{name} to exit")
        process.start()  # same ports
        assert http_post(process, vllm_batch(5).SerializeToString())[0] == 200
        assert process.stop() == 0
    finally:
        process.ensure_stopped()


def test_a_dead_ingest_process_stops_the_service_with_an_error(tmp_path: Path):
    """Without its receivers the service cannot take data: it says so, completes what it holds (the
    7 held traces reach the store), and exits non-zero so that its supervisor restarts it."""
    victim = "otel-llm-recv"
    keep_all = [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]
    process = ServerProcess(tmp_path, {"processors": {"tail_sampling": {"decision_wait": "60s", "policies": keep_all}}})
    process.start()
    try:
        assert process.process is not None
        assert http_post(process, vllm_batch(7, model="before-crash", parent=True).SerializeToString())[0] == 200
        process.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 7, what="7 traces held")
        os.kill(child_processes(process.process.pid)[victim], signal.SIGKILL)
        assert process.process.wait(timeout=30) == 1
        log = process.log_path.read_text()
        assert "ingest process exited unexpectedly" in log
        assert "completing pending traces" in log
        assert len(StoreReader(tmp_path / "store").list_requests(model="before-crash")) == 7
    finally:
        process.ensure_stopped()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_refusals_are_counted_before_the_client_sees_them(make_server, protocol):
    """The receiver counters live in shared memory: a scrape right after a refused call counts it."""
    server = make_server({"receivers": {"otlp": {"protocols": {"grpc": {"auth": {"bearer_token": "s3cret"}},
                                                               "http": {"auth": {"bearer_token": "s3cret"}}}}}})
    payload = vllm_batch(3).SerializeToString()
    for attempt in range(1, 6):
        if protocol == "grpc":
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel, \
                    pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(EXPORT)(payload, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        else:
            assert http_post(server, payload)[0] == 401
        assert server.scrape().value("otel_llm_receiver_refused_requests_total", protocol=protocol,
                                     reason="unauthenticated") == attempt


def test_receivers_refuse_once_their_pipe_is_broken():
    """When the process downstream is gone, an answer of "accepted" would lose the data: the
    forwarder refuses retryably instead, and counts it."""
    rig = forwarder_rig()
    forwarder, counters = rig.forwarder, rig.counters
    rig.reader.close()
    request = vllm_batch(3)
    assert forwarder.admit(request, request.SerializeToString(), "grpc").accepted == 3  # not known yet
    poll(forwarder.failed.is_set, 10, "the sender to find the pipe broken")
    refused = forwarder.admit(vllm_batch(4), None, "grpc")
    assert (refused.accepted, refused.refused, refused.retry_after_s) == (0, "shutting_down", 5)
    _, spans, _ = counters.snapshot()
    assert spans[("grpc", "shutting_down")] == 4


def test_nothing_is_admitted_behind_done():
    """The pipeline process stops reading at "done": a request admitted after it would be
    answered "accepted" and lost. The HTTP server's handler threads outlive its stop (and a
    keep-alive connection's thread serves its next request), so the forwarder itself refuses
    once "done" is queued, and gives back the room it had reserved."""
    rig = forwarder_rig()
    forwarder, state, counters, reader, writer = rig.forwarder, rig.state, rig.counters, rig.reader, rig.writer
    before = vllm_batch(3)
    assert forwarder.admit(before, before.SerializeToString(), "http").accepted == 3
    forwarder.finish()
    after = forwarder.admit(vllm_batch(4), None, "http")
    assert (after.accepted, after.refused) == (0, "shutting_down")
    forwarder.close(10)
    writer.close()
    messages = messages_until_closed(reader)
    assert [m[:1] for m in messages] == [BATCH, b"E"] and is_done_event(messages[-1])
    assert state.queued_spans == 3  # the admitted batch, waiting for the pipeline; the refused one released
    accepted, spans, _ = counters.snapshot()
    assert accepted["http"] == 3 and spans[("http", "shutting_down")] == 4


def test_only_bytes_the_core_validated_as_received_are_forwarded_as_validated():
    """The pipeline's reading skips validation for a ``VALIDATED`` message, so the receivers may
    mark only the bytes the core's ``span_ids`` walked, unchanged: a request parsed instead (JSON),
    re-serialized (an unusable id dropped) or refused must not carry the mark."""
    rig = forwarder_rig()
    forwarder, writer, reader = rig.forwarder, rig.writer, rig.reader
    receiver = OtlpHttpReceiver(HttpProtocol(endpoint="127.0.0.1:0"), forwarder)
    receiver.start()
    as_sent = vllm_batch(3, model="as-sent").SerializeToString()
    with_bad_id = vllm_batch(2, model="bad-id")
    with_bad_id.resource_spans[0].scope_spans[0].spans[1].span_id = bytes(8)  # all zero: unusable
    json_span = {"traceId": os.urandom(16).hex(), "spanId": os.urandom(8).hex(), "name": "llm_request", "kind": 2}
    json_body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [json_span]}]}]}).encode()  # OTLP JSON: hex ids
    try:
        target = SimpleNamespace(http_port=receiver.port)
        assert http_post(target, as_sent)[0] == 200
        assert http_post(target, with_bad_id.SerializeToString())[0] == 200
        assert http_post(target, json_body, content_type="application/json")[0] == 200
        assert http_post(target, as_sent[:-3])[0] == 400  # cut short: malformed
    finally:
        receiver.stop()
        forwarder.finish()
        forwarder.close(10)
        writer.close()
    messages = messages_until_closed(reader)
    header = BATCH_HEADER.size
    assert [(m[:1], BATCH_HEADER.unpack_from(m)[1]) for m in messages[:-1]] == [
        (VALIDATED, 3), (BATCH, 1), (BATCH, 1)]
    assert messages[0][header:] == as_sent  # the very bytes validated
    assert is_done_event(messages[-1])


def test_http_stop_gives_requests_in_progress_their_grace_and_refuses_new_ones():
    """On stop, the OTLP/HTTP receiver lets a request already in progress finish (it is admitted,
    ahead of "done") and refuses a new request on a keep-alive connection with a retryable
    ``shutting_down``, as grpcio's stop does for gRPC calls."""
    rig = forwarder_rig()
    forwarder, state, counters, writer = rig.forwarder, rig.state, rig.counters, rig.writer
    receiver = OtlpHttpReceiver(HttpProtocol(endpoint="127.0.0.1:0"), forwarder)
    receiver.start()
    one_span = vllm_batch(1).SerializeToString()
    five_spans = vllm_batch(5).SerializeToString()

    def post(connection: http.client.HTTPConnection, body: bytes) -> http.client.HTTPResponse:
        connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = connection.getresponse()
        response.read()
        return response

    def refuses_connections() -> bool:
        try:
            socket.create_connection(("127.0.0.1", receiver.port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        except OSError:  # reset: connected to a listener that was closing; ask again
            return False
        return False

    slow = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    idle = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    stopper = threading.Thread(target=receiver.stop, args=(30.0,))
    try:
        assert post(idle, one_span).status == 200  # a kept-alive connection, with its own thread
        slow.putrequest("POST", "/v1/traces")
        slow.putheader("Content-Type", "application/x-protobuf")
        slow.putheader("Content-Length", str(len(five_spans)))
        slow.endheaders()
        slow.send(five_spans[:10])  # in progress: its handler waits for the rest of the body
        poll(lambda: receiver.requests_in_progress == 1, 10, "the slow request to start")

        stopper.start()
        poll(refuses_connections, 10, "the listener to close")
        refused = post(idle, one_span)
        assert (refused.status, refused.getheader("Retry-After")) == (503, "5")
        assert stopper.is_alive()  # still giving the slow request its grace

        slow.send(five_spans[10:])
        answer = slow.getresponse()
        answer.read()
        assert answer.status == 200
        stopper.join(10)
        assert not stopper.is_alive()
    finally:
        slow.close()
        idle.close()
        if stopper.ident is None:  # never started
            receiver.stop()
        forwarder.finish()
        forwarder.close(10)
        writer.close()
    accepted, _, requests = counters.snapshot()
    assert accepted["http"] == 1 + 5  # the first idle request and the slow one
    assert requests[("http", "shutting_down")] == 1
    assert state.queued_spans == 6
