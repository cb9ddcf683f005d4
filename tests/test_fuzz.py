"""Mutated real OTLP payloads against a running server: zero crashes, every answer a valid OTLP
response or a clean refusal, and the server still measures good data afterwards."""

from __future__ import annotations

import http.client
import json
import random
import time

import grpc
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm_simulate.emitters import RequestTiming, emit_gateway, emit_sglang, emit_tgi, emit_vllm_v1, \
    engine_tracer_provider
from tests.test_bad_input import EXPORT, assert_still_serving

HTTP_INPUTS = 10_000
GRPC_INPUTS = 2_000


def seed_payloads() -> list[bytes]:
    """Real payloads of every engine shape, as the SDK encodes them."""
    memory = InMemorySpanExporter()
    now = time.time_ns()
    timing = RequestTiming(now, 0.01, 0.2, 0.3, 1.5)
    vllm = engine_tracer_provider("vllm-v1", memory, service_name="fuzz")
    gateway = engine_tracer_provider("gateway", memory)
    emit_gateway(gateway, start_unix_ns=now - 10**6, end_unix_ns=timing.end_unix_ns + 10**6, model="m",
                 engine_call=lambda headers: emit_vllm_v1(vllm, timing, request_id="f", traceparent_headers=headers))
    emit_sglang(engine_tracer_provider("sglang", memory), timing, rid="abcdef0123", model="m")
    emit_tgi(engine_tracer_provider("tgi", memory), timing)
    spans = memory.get_finished_spans()
    return [encode_spans(spans).SerializeToString()] + [encode_spans([s]).SerializeToString() for s in spans]


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if not buf:
            buf = bytearray(rng.choice(corpus))
        if choice < 0.35:  # flip bytes
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif choice < 0.5:  # truncate
            del buf[rng.randrange(len(buf)):]
        elif choice < 0.65:  # insert random bytes
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif choice < 0.75:  # duplicate a chunk
            a = rng.randrange(len(buf))
            b = min(len(buf), a + rng.randint(1, 200))
            buf[a:a] = buf[a:b]
        elif choice < 0.85:  # splice with another payload
            other = rng.choice(corpus)
            buf = buf[: rng.randrange(len(buf) + 1)] + bytearray(other[rng.randrange(len(other)):])
        elif choice < 0.95:  # a huge length prefix
            at = rng.randrange(len(buf))
            buf[at:at] = b"\x0a\xff\xff\xff\xff\x07"
        else:  # small ints where lengths are expected
            buf = bytearray(bytes([rng.randrange(1, 30)]) + bytes(buf[1:]))
    return bytes(buf)


def mutate_json(rng: random.Random) -> bytes:
    values = [None, True, -1, 1e308, "x" * rng.randint(0, 100), [], {}, [[[[]]]], "0" * 32, "zz", 2**70]
    span = {"traceId": rng.choice(["0" * 32, "ab" * 16, "zz", 5, None]), "spanId": rng.choice(["cd" * 8, "", 7]),
            "name": rng.choice(["llm_request", "generate", " Req 1", 3, None]), "kind": rng.choice([2, "SERVER", 99, -1]),
            "attributes": [{"key": rng.choice(["gen_ai.latency.e2e", "gen_ai.latency.time_to_first_token", "total_time"]),
                            "value": rng.choice([{"doubleValue": rng.choice(values)},
                                                 {"stringValue": rng.choice(values)},
                                                 {"intValue": rng.choice(values)}, rng.choice(values)])}
                           for _ in range(rng.randint(0, 5))],
            "startTimeUnixNano": rng.choice(values), "endTimeUnixNano": rng.choice(values)}
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    if rng.random() < 0.2:
        document = rng.choice(values)  # type: ignore[assignment]
    text = json.dumps(document)
    if rng.random() < 0.3 and text:
        at = rng.randrange(len(text))
        text = text[:at] + rng.choice(["{", "]", '"', "\\", ",", "\x00"]) + text[at + 1:]
    if rng.random() < 0.05:
        text = "[" * 5000 + "]" * 5000  # deep nesting
    return text.encode()


class Client:
    def __init__(self, port: int) -> None:
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, body: bytes, content_type: str) -> tuple[int, bytes, str]:
        for attempt in range(2):
            try:
                self.connection.request("POST", "/v1/traces", body, {"Content-Type": content_type})
                response = self.connection.getresponse()
                payload = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.connection.close()
                    self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                return response.status, payload, response.getheader("Content-Type", "")
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server legitimately closed after a refusal: reconnect once.
                self.connection.close()
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def check_http_answer(status: int, payload: bytes, content_type: str) -> str:
    if status == 200:
        if content_type == "application/json":
            json.loads(payload)
        else:
            ExportTraceServiceResponse.FromString(payload)
        return "ok"
    assert status in (400, 413, 415), f"unexpected HTTP {status}: {payload[:200]!r}"
    if content_type == "application/json":
        assert json.loads(payload)["message"]
    else:
        assert status_pb2.Status.FromString(payload).message
    return f"refused {status}"


def test_fuzz_http_and_grpc(server):
    rng = random.Random(20261130)
    corpus = seed_payloads()
    client = Client(server.http_port)
    outcomes: dict[str, int] = {}
    for i in range(HTTP_INPUTS):
        if i % 5 == 4:
            status, payload, content_type = client.post(mutate_json(rng), "application/json")
        else:
            status, payload, content_type = client.post(mutate(rng, rng.choice(corpus), corpus), "application/x-protobuf")
        result = check_http_answer(status, payload, content_type)
        outcomes[result] = outcomes.get(result, 0) + 1
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT)
        for _ in range(GRPC_INPUTS):
            try:
                ExportTraceServiceResponse.FromString(export(mutate(rng, rng.choice(corpus), corpus), timeout=30))
                outcomes["grpc ok"] = outcomes.get("grpc ok", 0) + 1
            except grpc.RpcError as error:
                assert error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), error
                outcomes["grpc refused"] = outcomes.get("grpc refused", 0) + 1
    print(f"\nfuzz: {HTTP_INPUTS + GRPC_INPUTS} inputs -> {dict(sorted(outcomes.items()))}")
    assert sum(outcomes.values()) == HTTP_INPUTS + GRPC_INPUTS
    # Both paths were exercised: some mutations still parse, most don't.
    assert outcomes.get("ok", 0) > 100 and outcomes.get("refused 400", 0) > 1000, outcomes
    assert outcomes.get("grpc ok", 0) > 20 and outcomes.get("grpc refused", 0) > 200, outcomes
    assert_still_serving(server)
    scrape = server.scrape()
    for name in ("vllm:e2e_request_latency_seconds_sum", "vllm:time_to_first_token_seconds_sum"):
        total = scrape.value(name)
        assert total == total and total != float("inf"), f"{name} must stay finite: {total}"
