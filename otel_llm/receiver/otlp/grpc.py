"""OTLP/gRPC receiver, on grpcio's asyncio server (``grpc.aio``).

A call costs a coroutine, not a thread, while it waits for its request: with the thread-pool server
a call that sent its headers and never its message held one of the ``workers`` threads, and four
such calls stopped every other Export. Here the handler starts with the call's headers, reads the
message itself, and cuts a call whose message has not arrived within ``read_timeout``
(``DEADLINE_EXCEEDED``, counted as ``read_timeout``). Decoding and admission are synchronous on the
loop: they never wait, so a call never holds the loop for longer than its own (bounded) message.

The handler takes the raw request bytes (no deserializer) so that a malformed message is
answered ``INVALID_ARGUMENT`` as the OTLP spec says, instead of grpcio's generic ``INTERNAL``.
grpcio itself still refuses, before the handler sees them and so uncounted: a message over
``max_recv_msg_size_mib`` (``RESOURCE_EXHAUSTED``), a ``grpc-encoding`` it cannot parse (``INTERNAL``,
in the transport) and one it knows but has disabled (``UNIMPLEMENTED``). There is no cap on calls in
progress (grpcio's ``maximum_concurrent_rpcs`` answered ``RESOURCE_EXHAUSTED``, which exporters take
as permanent): calls that wait are cheap and cut by ``read_timeout``, and the bounded intake
refuses retryably once it is full.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_llm.confmap import split_endpoint
from otel_llm.receiver.otlp.config import GrpcProtocol
from otel_llm.receiver.otlp.admission import WAITABLE, Admitter, request_spans, usable_ids
from otel_llm.receiver.otlp.nesting import cut_deep_values, too_deep
from otel_llm.receiver.otlp.othersignals import GRPC_SERVICES, count_items, new_request, new_response
from otel_llm.internal.security import TokenCheck, read_bytes

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
PROTOCOL = "grpc"


@dataclass(frozen=True)
class _RpcStatus(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...]


def retryable_status(message: str, retry_after_s: int) -> _RpcStatus:
    """UNAVAILABLE with a RetryInfo detail: the OTLP spec's retryable refusal, with a delay hint."""
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=retry_after_s))
    detail = any_pb2.Any()
    detail.Pack(retry)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message, details=[detail])
    return _RpcStatus(grpc.StatusCode.UNAVAILABLE, message, (("grpc-status-details-bin", status.SerializeToString()),))


class OtlpGrpcReceiver:
    """``start`` runs the asyncio server on a thread of its own (the receiver process's main thread
    waits on its control pipe) and returns once it listens; ``stop`` stops it from any thread."""

    def __init__(self, settings: GrpcProtocol, admitter: Admitter, admission_wait_s: float = 0.0) -> None:
        self._settings = settings
        self._admitter = admitter
        self._admission_wait = admission_wait_s  # receivers.otlp.admission_wait
        self._server: grpc.aio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._token = TokenCheck(settings.auth)
        self._read_timeout = settings.read_timeout
        self._waiting: dict[asyncio.Task[object], float] = {}  # calls waiting for their message: since
        self._expired: set[asyncio.Task[object]] = set()  # cancelled by the sweeper for read_timeout
        self._loop_time = time.monotonic
        self._sweeper: asyncio.Task[None] | None = None
        # An admitter that can wait on the disk (the intake log's fsync) is called from threads, so
        # that calls waiting for one fsync share it and the loop goes on reading other calls.
        self._admit_pool = concurrent.futures.ThreadPoolExecutor(max_workers=_ADMIT_THREADS,
                                                                 thread_name_prefix="otlp-grpc-admit") \
            if getattr(admitter, "may_block", False) else None
        self.port = 0

    async def _sweep(self) -> None:
        period = min(1.0, max(0.02, self._read_timeout / 10))
        waiting, expired = self._waiting, self._expired
        while True:
            await asyncio.sleep(period)
            cutoff = time.monotonic() - self._read_timeout
            for task, since in list(waiting.items()):
                if since <= cutoff and task not in expired:
                    expired.add(task)
                    task.cancel()

    async def _read_message(self, context: grpc.aio.ServicerContext) -> bytes:
        """The call's one message, after the token check, within ``read_timeout``."""
        admitter = self._admitter
        if self._token.enabled:  # before the message is read: a wrong token costs us nothing more
            header = next((value for key, value in context.invocation_metadata() or () if key == "authorization"),
                          None)
            if not self._token.allows(header if isinstance(header, str) else None):
                admitter.refuse_request(PROTOCOL, "unauthenticated")
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        # The sweeper cancels a read older than read_timeout (cheaper per call than a timer each).
        task = asyncio.current_task()
        assert task is not None  # grpc.aio runs each call's handler in a task of its own
        waiting = self._waiting
        waiting[task] = self._loop_time()
        try:
            payload = await context.read()
        except asyncio.CancelledError:
            if task not in self._expired:
                raise  # the call itself was cancelled (client gone, server stopping)
            task.uncancel()
            admitter.refuse_request(PROTOCOL, "read_timeout")
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no complete request message within {self._read_timeout:g}s (read_timeout)")
        finally:
            waiting.pop(task, None)
            self._expired.discard(task)
        if payload is grpc.aio.EOF:
            admitter.refuse_request(PROTOCOL, "malformed")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without a request message")
        assert isinstance(payload, bytes)
        return payload

    def _other_signal(self, signal: str) -> Any:
        """``MetricsService/Export`` or ``LogsService/Export``: decoded, counted, dropped (othersignals.py)."""
        async def export(request_iterator: object, context: grpc.aio.ServicerContext) -> bytes:
            payload = await self._read_message(context)
            request = new_request(signal)
            try:
                request.ParseFromString(payload)
            except DecodeError as exc:
                self._admitter.refuse_request(PROTOCOL, "malformed")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed OTLP {signal} request: {exc}")
            self._admitter.ignore(PROTOCOL, signal, count_items(signal, request))
            return new_response(signal).SerializeToString()
        return export

    async def _export(self, request_iterator: object, context: grpc.aio.ServicerContext) -> bytes:
        admitter = self._admitter
        payload = await self._read_message(context)
        ids = usable_ids(payload)
        request: ExportTraceServiceRequest | None = None
        if ids is None:  # parsed: no core, malformed, or ids to drop
            request = ExportTraceServiceRequest()
            try:
                request.ParseFromString(payload)
            except DecodeError as exc:
                cut = cut_deep_values(payload) if too_deep(exc) else None
                if cut is None:
                    admitter.refuse_request(PROTOCOL, "malformed")
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ExportTraceServiceRequest: {exc}")
                else:  # attribute values nested past the decoder's depth: cut there, the rest admitted
                    payload, cuts = cut
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(payload)
                    admitter.cut_values(PROTOCOL, cuts)
        if self._admission_wait:
            await self._wait_for_room(request_spans(request, ids), len(payload))
        if self._admit_pool is None:
            result = admitter.admit(request, payload, PROTOCOL, ids)  # never waits: on the loop
        else:
            result = await asyncio.get_running_loop().run_in_executor(self._admit_pool, admitter.admit, request,
                                                                      payload, PROTOCOL, ids)
        if result.refused:
            admitter.refuse_request(PROTOCOL, result.refused)
            status = retryable_status(f"refused: {result.refused}; retry later", result.retry_after_s)
            await context.abort(status.code, status.details, status.trailing_metadata)
        if result.rejected:
            return ExportTraceServiceResponse(
                partial_success=ExportTracePartialSuccess(rejected_spans=result.rejected,
                                                          error_message=result.error_message)
            ).SerializeToString()
        return _EMPTY_RESPONSE

    async def _wait_for_room(self, spans: int, size: int) -> None:
        """Up to ``admission_wait`` for the intake to have room (a coroutine: other calls go on)."""
        room = self._admitter.room
        if room(spans, size) not in WAITABLE:
            return
        deadline = time.monotonic() + self._admission_wait
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(_ROOM_POLL_S, left))
            if room(spans, size) not in WAITABLE:
                return

    async def _start(self) -> None:
        settings = self._settings
        max_bytes = settings.max_recv_msg_size_mib * 1024 * 1024
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
            ("grpc.so_reuseport", 0),
        ])
        # Registered as client-streaming, which is the same on the wire as unary: the handler then
        # runs from the call's headers and reads the one message itself, under read_timeout.
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {"Export": grpc.stream_unary_rpc_method_handler(self._export, request_deserializer=None,
                                                            response_serializer=None)},
        )
        others = [grpc.method_handlers_generic_handler(
            service, {"Export": grpc.stream_unary_rpc_method_handler(self._other_signal(signal), request_deserializer=None,
                                                                     response_serializer=None)})
            for service, signal in GRPC_SERVICES.items()]
        server.add_generic_rpc_handlers((handler, *others))
        host, port = split_endpoint(settings.endpoint)
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if settings.tls is not None:
                credentials = grpc.ssl_server_credentials(
                    [(read_bytes(settings.tls.key_file), read_bytes(settings.tls.cert_file))],
                    root_certificates=read_bytes(settings.tls.client_ca_file) if settings.tls.client_ca_file else None,
                    require_client_auth=bool(settings.tls.client_ca_file),
                )
                self.port = server.add_secure_port(bind, credentials)
            else:
                self.port = server.add_insecure_port(bind)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {settings.endpoint} for OTLP/gRPC: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot listen on {settings.endpoint} for OTLP/gRPC (address in use?)")
        await server.start()
        self._server = server
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            asyncio.set_event_loop(loop)

            async def main() -> None:
                try:
                    await self._start()
                except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
                    started.set_exception(exc)
                    return
                started.set_result(None)

            loop.run_until_complete(main())
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="otlp-grpc", daemon=True)
        self._thread.start()
        started.result()
        log.info("OTLP/gRPC receiver listening on %s:%d", split_endpoint(self._settings.endpoint)[0], self.port)

    def stop(self, grace_s: float) -> None:
        """Refuse new calls at once; calls in progress get ``grace_s`` to finish."""
        if self._server is None or self._loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._server.stop(grace_s), self._loop)
        try:
            future.result(grace_s + 10)
        except (concurrent.futures.TimeoutError, RuntimeError):
            log.warning("OTLP/gRPC: the server did not stop within its %.1fs grace", grace_s)


_EMPTY_RESPONSE = ExportTraceServiceResponse().SerializeToString()
_ADMIT_THREADS = 32
_ROOM_POLL_S = 0.01
