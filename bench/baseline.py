"""The baseline OTLP sink: the same servers otel-llm runs, doing nothing but ``ParseFromString``.

    python -m bench.baseline --grpc HOST:PORT --http HOST:PORT [--workers 4]

gRPC: a grpcio server with otel-llm's thread-pool size and options, the handler taking raw bytes
(no deserializer) like otel-llm's. HTTP: the stdlib ``ThreadingHTTPServer`` with HTTP/1.1
keep-alive, as otel-llm's receiver. Both parse the ``ExportTraceServiceRequest`` and discard it,
then answer an empty ``ExportTraceServiceResponse``. So the gap between this sink and otel-llm is
exactly what otel-llm does with the spans. Prints ``ready`` once both listen; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
EMPTY_RESPONSE = ExportTraceServiceResponse().SerializeToString()


def _export(payload: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
    ExportTraceServiceRequest().ParseFromString(payload)
    return ExportTraceServiceResponse()


def start_grpc(endpoint: str, workers: int) -> tuple[grpc.Server, int]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sink-grpc"),
        options=[
            ("grpc.max_receive_message_length", 4 * 1024 * 1024),
            ("grpc.max_concurrent_streams", 64),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=workers * 16,
    )
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {"Export": grpc.unary_unary_rpc_method_handler(
            _export, request_deserializer=None, response_serializer=ExportTraceServiceResponse.SerializeToString)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(endpoint)
    server.start()
    return server, port


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ExportTraceServiceRequest().ParseFromString(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(EMPTY_RESPONSE)))
        self.end_headers()
        self.wfile.write(EMPTY_RESPONSE)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline")
    parser.add_argument("--grpc", default="127.0.0.1:0")
    parser.add_argument("--http", default="127.0.0.1:0")
    parser.add_argument("--workers", type=int, default=4, help="gRPC handler threads (otel-llm's default: 4)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    grpc_server, grpc_port = start_grpc(args.grpc, args.workers)
    host, port = args.http.rsplit(":", 1)
    http_server = _Server((host, int(port)), _Handler)
    http_thread = threading.Thread(target=http_server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    http_thread.start()
    print(f"ready grpc={grpc_port} http={http_server.server_address[1]}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        grpc_server.stop(1).wait()
        http_server.shutdown()
        http_server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
