"""``python -m bench.stall``: how long one hostile span stalls span processing (issue 50).

Starts ``otel-llm serve`` (the real CLI, its defaults, loopback ports) and, per run, sends over
OTLP/HTTP one request of one span with ``--keys`` distinct attribute keys and no values (the issue's
shape: 250 000 keys, 2.1 MB), then at once a normal request (a gateway span over a vLLM span: a trace
that is ready one ``grace`` after it arrives), and times from the normal request's answer until its
trace is completed (``otel_llm_traces_completed_total`` moves: the hostile span's trace, with no
engine span, waits for ``decision_wait``). The same without the hostile request first is the
baseline; the stall is the difference. Prints one line per run and a ``RESULT`` line.

Not part of ``make bench``; before issue 50's fix a run took ~50 s at the default 250 000 keys.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from otel_llm.internal.wire import encode_varint

COMPLETED = re.compile(r"^otel_llm_traces_completed_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def hostile_request(keys: int) -> bytes:
    """One span with ``keys`` distinct attribute keys (hex numbers) and no values."""
    attributes = b"".join(_field(9, _field(1, b"%x" % i)) for i in range(keys))
    span = _field(1, os.urandom(16)) + _field(2, os.urandom(8)) + _field(5, b"x") + attributes
    return _field(1, _field(2, _field(2, span)))


def normal_request() -> bytes:
    """A gateway SERVER span over a vLLM ``llm_request`` span, as the SDK encodes them."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    now = time.time_ns()
    trace_id, gateway_id = os.urandom(16), os.urandom(8)
    request = ExportTraceServiceRequest()
    gateway = request.resource_spans.add()
    gateway.resource.attributes.add(key="service.name").value.string_value = "gateway"
    gateway.scope_spans.add().spans.add(trace_id=trace_id, span_id=gateway_id, name="POST /v1/chat/completions",
                                        kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=now - 60_000_000,
                                        end_time_unix_nano=now)
    engine = request.resource_spans.add()
    engine.resource.attributes.add(key="service.name").value.string_value = "vllm"
    span = engine.scope_spans.add().spans.add(trace_id=trace_id, span_id=os.urandom(8), parent_span_id=gateway_id,
                                              name="llm_request", kind=Span.SPAN_KIND_SERVER,
                                              start_time_unix_nano=now - 50_000_000, end_time_unix_nano=now)
    for key, value in (("gen_ai.latency.time_to_first_token", 0.02), ("gen_ai.latency.e2e", 0.05),
                       ("gen_ai.latency.time_in_queue", 0.001)):
        span.attributes.add(key=key).value.double_value = value
    span.attributes.add(key="gen_ai.usage.prompt_tokens").value.int_value = 32
    span.attributes.add(key="gen_ai.usage.completion_tokens").value.int_value = 8
    span.attributes.add(key="gen_ai.response.model").value.string_value = "m"
    return request.SerializeToString()


def post(port: int, body: bytes) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def completed(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        return sum(float(value) for value in COMPLETED.findall(response.read().decode()))


def run(keys: int, timeout_s: float) -> float:
    """Seconds from the normal request's answer until its trace was completed, on a fresh server."""
    with tempfile.TemporaryDirectory() as tmp:
        http_port, grpc_port, metrics_port = _free_port(), _free_port(), _free_port()
        config = {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                                                 "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
            "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{metrics_port}"},
                          "store": {"path": str(Path(tmp) / "store")}},
        }
        config_path = Path(tmp) / "otel-llm.yaml"
        config_path.write_text(json.dumps(config))  # JSON is YAML
        server = subprocess.Popen([sys.executable, "-m", "otel_llm", "serve", "--config", str(config_path)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=1) as ready:
                        if ready.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("otel-llm did not become ready")
                time.sleep(0.1)
            if keys:
                assert post(http_port, hostile_request(keys)) == 200
            assert post(http_port, normal_request()) == 200
            sent = time.monotonic()
            while completed(metrics_port) < 1:
                if time.monotonic() - sent > timeout_s:
                    return float("inf")
                time.sleep(0.02)
            return time.monotonic() - sent
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=250_000, help="distinct keys of the hostile span")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run waits for the normal trace")
    args = parser.parse_args(argv)
    size = len(hostile_request(args.keys))
    baseline, stalled = [], []
    for index in range(args.runs):
        baseline.append(run(0, args.timeout))
        stalled.append(run(args.keys, args.timeout))
        print(f"run {index + 1}: normal trace completed {baseline[-1]:.2f} s after its answer alone, "
              f"{stalled[-1]:.2f} s after a {size / 1e6:.1f} MB span of {args.keys} keys", flush=True)
    stall = sorted(s - b for s, b in zip(stalled, baseline))[len(stalled) // 2]
    print(f"RESULT keys={args.keys} bytes={size} median_stall_s={stall:.2f} "
          f"baseline_s={sorted(baseline)[len(baseline) // 2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
