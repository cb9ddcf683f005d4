"""Pending traces handed from a gracefully stopping process to the next start on the same store.

Behind the Collector's ``load_balancing`` exporter a trace's spans keep reaching the same replica
across its restart: the exports refused while it stops are retried to the process that replaces it.
A trace still pending at the stop is waiting for spans that then reach the *new* process: a gateway's
span whose engine span has not come (decided at stop, the gateway span is a request of its own and the
engine span, later, another: one request counted twice), or an engine span whose client's or proxy's
span is still in an exporter's batch (decided at stop, that span is measured alone, not joined). So a
graceful stop writes its pending traces here (``service.hand_over_pending_traces``) instead of deciding
them, and the next start buffers them again before its receivers listen, where their other spans join
them: nothing of them was measured yet (a trace is measured when it is decided).

The file holds what the intake log would hold: the spans as received, with ``processors.redaction``'s
rules applied before they are written (no content on disk). Records are ``carried.FRAME`` (length,
CRC-32) then one ``ExportTraceServiceRequest`` per trace. It is written under a temporary name
created exclusively, never through a link (``internal/files.py``), then renamed. It is read as
untrusted input: a damaged frame ends the reading, a record that does not decode is skipped, each
counted (``otel_llm_handover_damaged_records``), and the spans go through the receivers' id checks
(``Pipeline.take_over``). The file is read by one start only and then deleted (whatever that start's
own setting). A replica removed for good leaves it on its volume: its traces are measured when a
process next starts on that volume, not before (the stop logs how many it handed over and where).
Taken over, the traces are pending in the new process like any other; with ``receivers.otlp.intake_log``
on they are written to its carried file before the handover is deleted, so a crash of the new process
before they are decided loses none of them (without the log, a crash loses them as any pending trace).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from otel_llm.internal.files import replacing
from otel_llm.pdata.spans import PendingTrace
from otel_llm.processor.redaction.synthesis import Redaction
from otel_llm.receiver.otlp.carried import encode_spans, frame, frames

log = logging.getLogger(__name__)

HANDOVER_FILE = "handover"
# The most a stop writes: past it, the remaining traces are decided at stop as without a handover
# (max_traces bounds what is pending; this bounds the disk and the next start's work).
MAX_HANDOVER_BYTES = 256 << 20


def every_pending_trace(trace: PendingTrace) -> bool:
    """Which pending traces a graceful stop hands over: all of them (none is measured yet, and any of
    them may still get a span, which the load balancer sends to the next process)."""
    return True


@dataclass
class HandoverResult:
    traces: int = 0
    spans: int = 0
    not_written: list[PendingTrace] | None = None  # past MAX_HANDOVER_BYTES, or the file could not be written


def write_handover(path: Path, traces: list[PendingTrace], redaction: Redaction | None) -> HandoverResult:
    """Write ``traces`` for the next start (atomically: a stop cut short leaves no half file; and
    never through a link planted under the temporary name)."""
    result = HandoverResult(not_written=[])
    assert result.not_written is not None
    written = 0
    try:
        with replacing(path) as f:
            for index, trace in enumerate(traces):
                record = frame(encode_spans(trace.spans.values(), redaction))
                if written + len(record) > MAX_HANDOVER_BYTES:
                    result.not_written.extend(traces[index:])
                    break
                f.write(record)
                written += len(record)
                result.traces += 1
                result.spans += len(trace.spans)
    except OSError as exc:
        log.error("cannot hand pending traces over to the next start (%s): they are decided now", exc)
        return HandoverResult(not_written=list(traces))
    return result


@dataclass
class HandoverRead:
    requests: list[bytes]
    damaged: int = 0  # a damaged frame ends the reading: what follows it is lost


def read_handover(path: Path) -> HandoverRead | None:
    """The previous stop's handover; None without one. Not followed through a link. The caller
    deletes it (``remove_handover``) once its traces are taken over: one start takes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.error("cannot read the previous run's handover %s: %s", path, exc)
        return None
    try:
        size = os.fstat(fd).st_size
        if size > MAX_HANDOVER_BYTES + (1 << 20):
            log.error("the previous run's handover %s is %d bytes, more than a stop writes: not read, moved "
                      "to %s", path, size, path.with_suffix(".refused"))
            os.replace(path, path.with_suffix(".refused"))
            return HandoverRead([], damaged=1)
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read()
    except OSError as exc:
        log.error("cannot read the previous run's handover %s: %s", path, exc)
        return None
    finally:
        os.close(fd)
    requests, damaged, _ = frames(data)
    return HandoverRead(requests, damaged)


def remove_handover(path: Path) -> None:
    try:
        path.unlink()
    except OSError as exc:
        log.error("cannot delete the handover %s once read (%s): the next start would take it again", path, exc)
