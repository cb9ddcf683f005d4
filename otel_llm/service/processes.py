"""The ingest process, seen from the pipeline process: receivers → here.

``otel-llm serve`` runs two processes:

- ``otel-llm-recv`` (``receiver/otlp/process.py``): OTLP/gRPC and OTLP/HTTP; answers Export calls.
- this one, ``otel-llm``: the adapters, trace assembly, metrics, sampling, store, exporters,
  ``/metrics`` and the API.

So Export latency does not depend on the pipeline's load. Messages flow in order through the
pipe, so when the receivers' "done" event arrives here, everything they admitted has arrived
before it. If this process dies, the receivers see their control pipe close and exit. If the
receiver process dies, ``exited_unexpectedly`` is set and ``otel-llm serve`` stops with exit code 1.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from otel_llm.internal.runtime import name_thread
from otel_llm.receiver.otlp.config import OtlpReceiver
from otel_llm.receiver.otlp.intake_log import IntakeLogSettings, IntakeLogShared
from otel_llm.receiver.otlp.process import (
    BATCH,
    BATCH_HEADER,
    EVENT,
    IntakeState,
    ReceiverArgs,
    ReceiverCounters,
    VALIDATED,
    grow_pipe,
    run_receiver_process,
)

log = logging.getLogger(__name__)


class IngestProcesses:
    """Starts the receiver process, reads the requests it admitted into the pipeline, stops it."""

    def __init__(self, otlp: OtlpReceiver, state: IntakeState, counters: ReceiverCounters,
                 put: Callable[[bytes, int, int, bool], None], context: Any) -> None:
        self._otlp = otlp
        self._state = state
        self._counters = counters
        self._put = put  # data, accepted spans, request bytes, whether the receivers' core validated it
        self._context = context
        self.grpc_port = 0
        self.http_port = 0
        self.exited_unexpectedly = threading.Event()
        self._processes: list[Any] = []
        self._reader: threading.Thread | None = None
        self._control: Connection | None = None
        self._data: Connection | None = None
        self._events: deque[dict[str, Any]] = deque()
        self._event = threading.Condition()
        self._stopping = False
        self._done = False
        # receivers.otlp.intake_log: set by the service once the log is replayed (the writer's first seq)
        self.intake_log: IntakeLogSettings | None = None
        self.intake_log_shared: IntakeLogShared | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        otlp, context = self._otlp, self._context
        level = logging.getLogger("otel_llm").getEffectiveLevel()
        requests_read, requests_write = context.Pipe(duplex=False)
        control_read, control_write = context.Pipe(duplex=False)
        grow_pipe(requests_read)
        receivers = context.Process(
            target=run_receiver_process,
            args=(ReceiverArgs(otlp, otlp.protocols.grpc is not None, otlp.protocols.http is not None, level,
                               self.intake_log, self.intake_log_shared),
                  self._state, self._counters, requests_write, control_read),
            name="otel-llm-receivers", daemon=True)
        children_ends = [requests_write, control_read]
        self._data = requests_read
        receivers.start()
        self._processes.append(receivers)
        # Our copies of the child's ends would keep each pipe open after its writer exits: no EOF.
        for end in children_ends:
            end.close()
        self._control = control_write
        self._reader = threading.Thread(target=self._read_loop, name="otel-llm-ingest-pipe", daemon=True)
        self._reader.start()
        event = self._wait_event(timeout_s)
        if event is None or event.get("event") != "ready":
            exited = self._done
            self.stop(0)
            if event:
                detail = event.get("message")
            elif exited:
                codes = ", ".join(f"{p.name} {p.exitcode}" for p in self._processes)
                detail = f"the receiver process exited while starting (exit codes: {codes}); see its log above"
            else:
                detail = f"the receiver process did not report listening within {timeout_s:.0f}s"
            raise OSError(str(detail))
        self.grpc_port, self.http_port = int(event["grpc_port"]), int(event["http_port"])

    def _wait_event(self, timeout_s: float) -> dict[str, Any] | None:
        with self._event:
            self._event.wait_for(lambda: self._events or self._done, timeout_s)
            return self._events.popleft() if self._events else None

    def _read_loop(self) -> None:
        name_thread("otel-llm-intake")
        assert self._data is not None
        recv = self._data.recv_bytes
        put = self._put
        batch_header_size = BATCH_HEADER.size
        try:
            while True:
                message = recv()
                tag = message[:1]
                if tag == BATCH or tag == VALIDATED:
                    _, spans = BATCH_HEADER.unpack_from(message)
                    put(message[batch_header_size:], spans, len(message) - batch_header_size, tag == VALIDATED)
                elif tag == EVENT:
                    event = json.loads(message[1:])
                    if event.get("event") == "done":
                        break
                    if event.get("event") == "error":
                        self._stopping = True  # start-up failed: ``start`` raises it; the EOF that follows is expected
                    with self._event:
                        self._events.append(event)
                        self._event.notify_all()
        except (EOFError, OSError):
            if not self._stopping:
                log.error("an ingest process exited unexpectedly (exit codes: %s)",
                          ", ".join(f"{p.name} {p.exitcode}" for p in self._processes))
                self.exited_unexpectedly.set()
        finally:
            with self._event:
                self._done = True
                self._event.notify_all()

    def stop(self, grace_s: float) -> None:
        """Stop accepting (in-flight calls get ``grace_s``); returns once everything admitted has arrived."""
        self._stopping = True
        if self._control is not None:
            try:
                self._control.send(("stop", grace_s))
            except OSError:
                pass
        with self._event:
            self._event.wait_for(lambda: self._done, grace_s + 15)
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                log.error("%s did not exit; killing it", process.name)
                process.kill()
                process.join(5)
        for connection in (self._control, self._data):
            if connection is not None:
                connection.close()
