"""The crash-safe intake (opt-in, ``receivers.otlp.intake_log``): a write-ahead log of admitted requests.

Without it, everything between the answer "accepted" and a trace's decision lives in memory: a
SIGKILL (an OOM kill, a node drain that does not wait) loses every request acknowledged in the last
``decision_wait``. With it:

- **Written before the answer.** The receiver process appends each admitted request (the bytes it
  forwards, after the id check) to the current *segment* before the receiver answers, in the order
  the requests go down the pipe (``Forwarder.admit`` appends under the lock that orders the pipe).
  A segment is ``intake-<first seq>.wal``: records back to back, each ``RECORD`` (payload length,
  CRC-32, sequence number, span count) then the payload. Segments rotate at ``segment_size_mib``.
- **fsync policy.** ``write(2)`` puts the record in the kernel's page cache, which a process crash
  cannot lose: under every policy a SIGKILL or OOM kill of otel-llm loses nothing acknowledged.
  What the policy decides is what a *machine* crash (kernel panic, power loss, VM reset) loses:
  ``always``: nothing; the admitting thread waits for ``fdatasync`` (group commit: one call covers
  every request written before it) before the answer. ``interval`` (default): at most the last
  ``fsync_interval`` of acknowledged requests; a background thread syncs, the Export path never
  waits. ``never``: whatever the kernel had not written back (Linux: up to ~30 s by default).
- **Bounded.** ``max_size_mib`` of segments on disk; past it requests are refused retryably
  (``intake_log_full``: gRPC ``UNAVAILABLE`` with ``RetryInfo``, HTTP 429 with ``Retry-After``) and
  counted. A write error refuses the same way (``intake_log_error``) after cutting the partial record.
- **Truncated once handled.** The pipeline process (``IntakeLogKeeper``) tracks each record: it is
  *handled* once processed and ``decision_wait`` has passed since (by then the assembler has decided
  every trace it touched: a trace is decided ``decision_wait`` after it was first seen at the latest)
  and the store has written every kept trace decided up to then (``TraceStore.flush``). The handled
  prefix is persisted in ``checkpoint``; segments wholly below it are deleted.
- **Carried traces.** A trace still pending past ``decision_wait`` (held for a call in flight, up to
  ``max_open_call_wait``; or buffered again at start) does not hold its requests in the log: its spans
  are appended to ``carried.log`` (``carried.py``) before the checkpoint passes them, and a tombstone
  once it leaves the buffer, so the segments' size tracks ``decision_wait`` whatever is held. The
  ticker takes a snapshot of those traces at most every ``CHECKPOINT_EVERY_S`` (under the pipeline's
  tick lock: no trace is between the buffer and its journaled decision then); the checkpoint thread
  appends it, then checkpoints what was handled when it was taken. A journal is deleted only once a
  snapshot taken after it was closed is on disk, so a carried trace decided in it has its tombstone.
- **Exactly-once for metrics.** A request usually holds spans of traces decided long before the
  request is handled (a trace is decided ``grace`` after it is complete; its neighbour in the same
  request may wait for ``decision_wait``). So each decision is appended to a *decision journal*
  (``decided-<seq>.log``: trace id, the decision, the engine spans measured) as it is made, and a
  late engine span measured is appended too. At replay, a trace found in the journal is assembled
  again but not measured again (only engine spans not in its measured set are) and not decided
  again: its recorded decision is reused, and a kept trace is delivered again to the store, whose
  rows are keyed by (trace id, span id), so it is stored once.
- **Replayed at start**, before the receivers listen (``/readyz`` is 503 meanwhile): the carried
  traces first, buffered again; then every record after the checkpoint, through the bounded intake;
  a torn or corrupt record ends its segment and is counted (it can only be one that was never
  acknowledged, or damage after a machine crash); the reading resumes at the next valid record, so
  it costs that record only.
- **Write errors** (ENOSPC, EIO) never stop a thread: counted by file and reason, ingest refused
  retryably and ``/readyz`` 503 until a write succeeds again; ``min_free_mib`` keeps the log from
  filling its filesystem.

What it does not cover: kept traces handed to an OTLP exporter are "handled" once handed over; its
in-memory queue is lost in a crash unless that exporter has ``sending_queue.storage``.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_llm.internal.files import fsync_directory, replacing
from otel_llm.internal.telemetry import TelemetryFamily
from otel_llm.pdata.spans import PendingTrace
from otel_llm.receiver.otlp.carried import CarriedFile, CarriedSpans, encode_spans

log = logging.getLogger(__name__)

FSYNC_POLICIES = ("always", "interval", "never")
# Refusal reasons (receivers/admission.py holds the vocabulary and the retry hints).
LOG_FULL = "intake_log_full"
LOG_ERROR = "intake_log_error"

RECORD = struct.Struct("<IIQI")  # payload length, crc32 of (seq, spans, payload), seq, spans
_SEQ_SPANS = struct.Struct("<QI")
SEGMENT_PREFIX, SEGMENT_SUFFIX = "intake-", ".wal"
JOURNAL_PREFIX, JOURNAL_SUFFIX = "decided-", ".log"
CHECKPOINT = "checkpoint"
# The pipeline process holds KEEPER_LOCK, its receiver process WRITER_LOCK: a second otel-llm on
# the same directory is refused, and a restart waits until the previous receiver process is gone
# (it could otherwise still append a request behind the replay's back).
KEEPER_LOCK, WRITER_LOCK = "keeper.lock", "writer.lock"
CARRIED = "carried.log"
_CHECKPOINT = struct.Struct("<8sQI")  # magic, last handled seq, crc32 of the first two
_CHECKPOINT_MAGIC = b"otllmck1"
_DECIDED = struct.Struct("<c16sBBBBH")  # b"D", trace id, keep, rate_limited, len(policy), len(threshold), measured
_MEASURED = struct.Struct("<c16s8s")  # b"M", trace id, span id: a late engine span measured
_MAX_PAYLOAD = 1 << 30


def segment_name(first_seq: int) -> str:
    return f"{SEGMENT_PREFIX}{first_seq:020d}{SEGMENT_SUFFIX}"


def journal_name(first_seq: int) -> str:
    return f"{JOURNAL_PREFIX}{first_seq:020d}{JOURNAL_SUFFIX}"


def _numbered(directory: Path, prefix: str, suffix: str) -> list[tuple[int, Path]]:
    out = []
    for path in directory.iterdir():
        name = path.name
        if name.startswith(prefix) and name.endswith(suffix) and name[len(prefix):-len(suffix)].isdigit():
            out.append((int(name[len(prefix):-len(suffix)]), path))
    return sorted(out)


def lock_file(path: Path, timeout_s: float) -> int:
    """An exclusive ``flock`` on ``path``, waiting up to ``timeout_s``; returns its fd (closing it unlocks)."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise OSError(f"{path} is locked by another otel-llm process") from None
            time.sleep(0.02)


class IntakeLogShared:
    """Shared memory between the receiver process (appends) and the pipeline process (deletes,
    reports): the log's size on disk, the last sequence number written, and the writer's counters."""

    SIZE, LAST_SEQ, APPENDED_BYTES, APPENDED_REQUESTS, FSYNCS, REFUSED_FULL, REFUSED_ERROR, FSYNC_ERRORS = range(8)
    # A write the writer could not make: when (CLOCK_MONOTONIC ns, 0 once a write succeeds again) and
    # its errno; the keeper's own (journal, checkpoint) the same; segment write errors by reason;
    # requests refused for the free-space floor (``min_free_mib``).
    WRITER_ERROR_AT, WRITER_ERRNO, KEEPER_ERROR_AT, KEEPER_ERRNO, REFUSED_LOW_DISK = range(8, 13)
    WRITE_ERRORS = 13  # + index in WRITE_ERROR_REASONS
    # Attributes removed or reduced before writing, by processors.redaction's reasons (REDACTED + i).
    REDACTED = WRITE_ERRORS + 3
    REDACTION_REASONS = ("not_allowed", "url_reduced", "content_key", "free_text", "content_event")
    SLOTS = REDACTED + len(REDACTION_REASONS)

    def __init__(self, context: Any) -> None:
        self._lock = context.Lock()
        self.values = context.RawArray("q", self.SLOTS)

    def try_add(self, size: int, max_bytes: int) -> bool:
        """Room for ``size`` more bytes? (An empty log takes any record, so no request is refused forever.)"""
        with self._lock:
            current = self.values[self.SIZE]
            if current and current + size > max_bytes:
                return False
            self.values[self.SIZE] = current + size
            return True

    def appended(self, seq: int, size: int) -> None:
        with self._lock:
            values = self.values
            values[self.LAST_SEQ] = seq
            values[self.APPENDED_BYTES] += size
            values[self.APPENDED_REQUESTS] += 1

    def add(self, index: int, delta: int) -> None:
        with self._lock:
            self.values[index] += delta

    def set(self, index: int, value: int) -> None:
        with self._lock:
            self.values[index] = value

    def __getitem__(self, index: int) -> int:
        return self.values[index]


# Write errors (segments in the receiver process; journal and checkpoint in the pipeline process), by reason.
WRITE_ERROR_REASONS = ("no_space", "io_error", "other")
# /readyz is 503 while a write failed this recently and none has succeeded since.
ERROR_READINESS_S = 10.0


def write_error_reason(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no_space"
    if exc.errno == errno.EIO:
        return "io_error"
    return "other"


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on ``directory``'s filesystem."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


# Kept free above ``min_free_bytes`` for block rounding and the pipeline's own (ungated) journal and
# checkpoint writes: a 4 MiB filesystem's floor was undershot by 16 KiB without it.
LOW_DISK_RESERVE = 256 << 10


@dataclass(frozen=True)
class IntakeLogSettings:
    directory: str
    fsync: str = "interval"
    fsync_interval_s: float = 1.0
    segment_bytes: int = 16 << 20
    max_bytes: int = 1 << 30
    start_seq: int = 1  # set by the pipeline process after replay: the writer's first sequence number
    min_free_bytes: int = 64 << 20  # the writer refuses (intake_log_full) below this much free space
    # processors.redaction's rules (a ``Redaction``), applied by the receiver process to each request
    # before it is written: no prompt or completion is ever on the log's disk. None: allow_content.
    redaction: Any = None


# --- the receiver process's side: the writer --------------------------------------------------------

class IntakeLogWriter:
    """Appends admitted requests; thread-safe. ``append`` then (for ``always``) ``wait_durable``."""

    def __init__(self, settings: IntakeLogSettings, shared: IntakeLogShared) -> None:
        self._settings = settings
        self._shared = shared
        self._directory = Path(settings.directory)
        self._lock = threading.Lock()
        self._synced = threading.Condition(self._lock)
        self._sync_lock = threading.Lock()  # held during an fdatasync; rotation takes it too
        self._next_seq = settings.start_seq
        self._written = settings.start_seq - 1  # last sequence number written
        self._durable = settings.start_seq - 1  # last one known to be on stable storage
        self._syncing = False
        self._failing = False
        self._fd = -1
        self._generation = 0
        self._segment_size = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Held for the process's life: the next start waits for this process to be gone.
        self._writer_lock = lock_file(self._directory / WRITER_LOCK, timeout_s=10)
        with self._lock:
            self._open_segment()
        if settings.fsync == "interval":
            self._thread = threading.Thread(target=self._sync_loop, name="otel-llm-intake-log-sync", daemon=True)
            self._thread.start()

    def redact(self, request: Any) -> bool:
        """Apply processors.redaction's rules to ``request`` (an ``ExportTraceServiceRequest``) in
        place, before it is written; whether anything changed (its bytes must then be serialized
        again). Called outside the append lock: handler threads redact in parallel."""
        redaction = self._settings.redaction
        if redaction is None:
            return False
        changed = False
        for reason, count in redaction.apply_to_request(request).by_reason():
            if count:
                self._shared.add(IntakeLogShared.REDACTED + IntakeLogShared.REDACTION_REASONS.index(reason), count)
                changed = True
        return changed

    def _open_segment(self) -> None:
        path = self._directory / segment_name(self._next_seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
        self._generation += 1
        self._segment_size = os.fstat(self._fd).st_size
        if self._segment_size:
            # Every record on disk is below ``_next_seq`` (the keeper read them all), so a file named
            # after it can only hold a torn write: never append behind it.
            log.warning("intake log: %s held %d bytes of no valid record; cut", path.name, self._segment_size)
            os.ftruncate(self._fd, 0)
            self._shared.add(IntakeLogShared.SIZE, -self._segment_size)
            self._segment_size = 0
        if self._settings.fsync != "never":
            fsync_directory(self._directory)  # the new file's name survives a machine crash too

    def append(self, spans: int, payload: bytes) -> tuple[str, int]:
        """Write one admitted request: ("", its sequence number), or (a refusal reason, 0)."""
        size = RECORD.size + len(payload)
        shared = self._shared
        with self._lock:
            if shared[shared.KEEPER_ERROR_AT]:  # the pipeline cannot journal or checkpoint: nothing would be freed
                shared.add(shared.REFUSED_ERROR, 1)
                return LOG_ERROR, 0
            if not shared.try_add(size, self._settings.max_bytes):
                shared.add(shared.REFUSED_FULL, 1)
                return LOG_FULL, 0
            if self._settings.min_free_bytes and self._low_disk(size):
                shared.add(shared.SIZE, -size)
                shared.add(shared.REFUSED_LOW_DISK, 1)
                return LOG_FULL, 0
            seq = self._next_seq
            crc = zlib.crc32(payload, zlib.crc32(_SEQ_SPANS.pack(seq, spans)))
            header = RECORD.pack(len(payload), crc, seq, spans)
            try:
                written = os.writev(self._fd, [header, payload])
                while written < size:  # a short write: the rest, or an error
                    rest = (header + payload)[written:]
                    written += os.write(self._fd, rest)
            except OSError as exc:
                shared.add(shared.SIZE, -size)
                shared.add(shared.REFUSED_ERROR, 1)
                shared.add(shared.WRITE_ERRORS + WRITE_ERROR_REASONS.index(write_error_reason(exc)), 1)
                shared.set(shared.WRITER_ERRNO, exc.errno or 0)
                shared.set(shared.WRITER_ERROR_AT, time.monotonic_ns() or 1)
                if not self._failing:  # once per outage, not once per refused request
                    log.error("intake log: cannot write %s: %s; refusing (retryable) until a write succeeds",
                              segment_name(seq), exc)
                self._failing = True
                try:  # no partial record may stay in front of the next one
                    os.ftruncate(self._fd, self._segment_size)
                except OSError:
                    pass
                return LOG_ERROR, 0
            if self._failing:
                self._failing = False
                shared.set(shared.WRITER_ERROR_AT, 0)
                log.warning("intake log: writing again")
            self._next_seq = seq + 1
            self._written = seq
            self._segment_size += size
            shared.appended(seq, size)
            if self._segment_size >= self._settings.segment_bytes:
                self._rotate()
        return "", seq

    def _low_disk(self, size: int) -> bool:
        """Would ``size`` more bytes leave less than ``min_free_bytes`` free on the filesystem? (The
        floor keeps room for the pipeline's journal and checkpoint, which free the log.)"""
        try:
            # Blocks, not bytes (a write takes whole blocks), plus the pipeline's journal and checkpoint
            # writes since the last check, which no floor gates: the floor itself stays free.
            return free_bytes(self._directory) - size - LOW_DISK_RESERVE < self._settings.min_free_bytes
        except OSError:
            return False  # the write itself will tell

    def _rotate(self) -> None:
        """Under ``_lock``: sync (unless ``never``) and close the full segment, open the next."""
        with self._sync_lock:
            if self._settings.fsync != "never":
                self._fdatasync(self._fd)
                self._durable = self._written
                self._synced.notify_all()
            old, old_size = self._fd, self._segment_size
            try:
                self._open_segment()
            except OSError as exc:  # no inode or no room for the new file: keep the full one, try again later
                self._fd, self._segment_size = old, old_size
                self._shared.add(IntakeLogShared.WRITE_ERRORS + WRITE_ERROR_REASONS.index(write_error_reason(exc)), 1)
                log.error("intake log: cannot open the next segment: %s", exc)
                return
            os.close(old)

    def _fdatasync(self, fd: int) -> None:
        try:
            os.fdatasync(fd)
            self._shared.add(self._shared.FSYNCS, 1)
        except OSError as exc:  # the data is still in the page cache: a process crash loses nothing
            self._shared.add(self._shared.FSYNC_ERRORS, 1)
            log.error("intake log: fdatasync failed: %s", exc)

    def sync(self) -> None:
        """Make everything written so far durable (one fdatasync shared by concurrent callers)."""
        with self._lock:
            target = self._written
            while self._durable < target:
                if self._syncing:
                    self._synced.wait()
                    continue
                self._syncing = True
                fd, generation, upto = self._fd, self._generation, self._written
                self._lock.release()
                try:
                    with self._sync_lock:
                        if generation == self._generation:  # else a rotation synced and closed that file
                            self._fdatasync(fd)
                finally:
                    self._lock.acquire()
                    self._syncing = False
                self._durable = max(self._durable, upto)
                self._synced.notify_all()

    def wait_durable(self, seq: int) -> None:
        """With ``fsync: always``, return once record ``seq`` is on stable storage."""
        if self._settings.fsync == "always" and seq > self._durable:
            self.sync()

    def _sync_loop(self) -> None:
        while not self._stop.wait(self._settings.fsync_interval_s):
            if self._durable < self._written:
                self.sync()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._settings.fsync != "never":
            self.sync()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        os.close(self._writer_lock)


# --- reading ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Record:
    seq: int
    spans: int
    payload: bytes


@dataclass(slots=True)
class SegmentScan:
    records: list[Record]
    damaged: int  # runs of bytes that framed no valid record, each skipped to the next valid record
    valid_end: int  # the end of the last valid record: what follows is a torn write or damage
    size: int


def _record_at(data: bytes, offset: int) -> tuple[Record, int] | None:
    if offset + RECORD.size > len(data):
        return None
    length, crc, seq, spans = RECORD.unpack_from(data, offset)
    end = offset + RECORD.size + length
    if length > _MAX_PAYLOAD or end > len(data):
        return None
    payload = data[offset + RECORD.size:end]
    if zlib.crc32(payload, zlib.crc32(_SEQ_SPANS.pack(seq, spans))) != crc:
        return None
    return Record(seq, spans, payload), end


def _resync(data: bytes, start: int, after_seq: int) -> int | None:
    """The offset of the next valid record at or after ``start`` whose sequence number follows
    ``after_seq``. A segment's records are numbered one by one, so the next valid one is found by
    its sequence number's bytes (the header's third field) first, then by a scan."""
    seq_at = RECORD.size - _SEQ_SPANS.size  # offset of seq in the header
    best: int | None = None
    for seq in range(after_seq + 1, after_seq + 65):
        needle = seq.to_bytes(8, "little")
        position = data.find(needle, start + seq_at)
        while position >= 0 and (best is None or position - seq_at < best):
            found = _record_at(data, position - seq_at)
            if found is not None:
                best = position - seq_at
                break
            position = data.find(needle, position + 1)
    if best is not None:
        return best
    for offset in range(start, len(data) - RECORD.size + 1):  # more than 64 records lost in a row
        seq = int.from_bytes(data[offset + seq_at:offset + seq_at + 8], "little")
        if after_seq < seq <= after_seq + (1 << 32) and _record_at(data, offset) is not None:
            return offset
    return None


def read_segment(path: Path, first_seq: int | None = None) -> SegmentScan:
    """The valid records of a segment, in order. A torn or corrupt record costs that record only:
    the reading resumes at the next valid record (``damaged`` counts the runs skipped)."""
    data = path.read_bytes()
    records: list[Record] = []
    offset, damaged, valid_end = 0, 0, 0
    last_seq = (first_seq - 1) if first_seq is not None else 0
    while offset < len(data):
        found = _record_at(data, offset)
        if found is not None:
            record, offset = found
            records.append(record)
            last_seq, valid_end = record.seq, offset
            continue
        damaged += 1
        resumed = _resync(data, offset + 1, last_seq)
        if resumed is None:
            break
        offset = resumed
    return SegmentScan(records, damaged, valid_end, len(data))


@dataclass(slots=True)
class PriorDecision:
    """A trace decided before a crash, from the decision journal."""

    keep: bool
    rate_limited: bool
    policy: str
    threshold: str
    measured: set[bytes]


def read_journal(path: Path, into: dict[bytes, PriorDecision]) -> None:
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        tag = data[offset:offset + 1]
        if tag == b"D" and offset + _DECIDED.size <= len(data):
            _, trace_id, keep, rate_limited, policy_len, threshold_len, measured = _DECIDED.unpack_from(data, offset)
            start = offset + _DECIDED.size
            end = start + policy_len + threshold_len + 8 * measured
            if end > len(data):
                return  # torn tail
            policy = data[start:start + policy_len].decode("utf-8", "replace")
            threshold = data[start + policy_len:start + policy_len + threshold_len].decode("ascii", "replace")
            spans_start = start + policy_len + threshold_len
            ids = {data[i:i + 8] for i in range(spans_start, end, 8)}
            prior = into.get(trace_id)
            if prior is not None:
                ids |= prior.measured
            into[trace_id] = PriorDecision(bool(keep), bool(rate_limited), policy, threshold, ids)
            offset = end
        elif tag == b"M" and offset + _MEASURED.size <= len(data):
            _, trace_id, span_id = _MEASURED.unpack_from(data, offset)
            prior = into.get(trace_id)
            if prior is not None:
                prior.measured.add(span_id)
            offset += _MEASURED.size
        else:
            return  # torn tail or damage: what follows cannot be framed


def read_checkpoint(directory: Path) -> int | None:
    """The last handled sequence number; 0 without a checkpoint; None for an unreadable one (empty,
    torn, garbage): the keeper then rebuilds it from the segments."""
    try:
        data = (directory / CHECKPOINT).read_bytes()
    except FileNotFoundError:
        return 0
    if len(data) == _CHECKPOINT.size:
        magic, handled, crc = _CHECKPOINT.unpack(data)
        if magic == _CHECKPOINT_MAGIC and crc == zlib.crc32(data[:16]):
            return int(handled)
    return None


# --- the pipeline process's side: tracking, checkpoints, replay, telemetry --------------------------

@dataclass(slots=True)
class _CarrySnapshot:
    """Taken by the ticker: what the carried file needs so that every record <= ``handled`` can be
    checkpointed (the traces pending at ``taken_at``)."""

    handled: int
    taken_at: float
    carried: list[CarriedSpans]
    left: list[bytes]  # carried traces no longer pending: tombstones


class IntakeLogKeeper:
    """Knows which logged requests are handled, persists that, deletes what is no longer needed,
    journals decisions, and replays the log at start.

    Requests arrive (``arrived``) in log order: the pipeline process reads them from one pipe in
    the order the receiver process logged them, so the n-th request after the replay is record
    ``start_seq + n``. Call order: ``open`` (then buffer ``carried_in`` again, and ``carry`` any
    trace taken over), ``recover`` (feed what it yields), ``receiver_settings``, ``start``; per
    request ``arrived`` and, once the worker has buffered it, ``processed``; after each assembler
    tick ``ticked``; ``close`` last."""

    CHECKPOINT_EVERY_S = 0.5
    JOURNAL_ROTATE_S = 2.0

    def __init__(self, settings: IntakeLogSettings, shared: IntakeLogShared, decision_wait_s: float) -> None:
        self.settings = settings
        self.shared = shared
        self.directory = Path(settings.directory)
        self._decision_wait_s = decision_wait_s
        self.barriers: list[Callable[[float], bool]] = []  # e.g. TraceStore.flush: all submitted written
        # Log order: [seq, processed_at or None]; the ticker pops the handled prefix.
        self._marks: deque[list[Any]] = deque()
        self._to_process: deque[list[Any]] = deque()
        self._next_seq = 1
        self._reached = 0  # every record <= this was processed decision_wait before the last tick
        self._handled = 0  # every record <= this is handled (not yet checkpointed)
        self._checkpointed = 0
        self._replay_end = 0
        self.prior: dict[bytes, PriorDecision] = {}
        self._journal_lock = threading.Lock()
        self._journal_fd = -1
        self._journal_opened = 0.0
        self._journals: list[tuple[int, Path]] = []
        self._journal_switched: dict[Path, float] = {}  # a journal -> when it took over from the one before
        self._journal_pin: int | None = None
        self._journal_buffer: list[bytes] = []
        self._keeper_lock = -1
        self._last_fsync = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.replayed_requests = 0
        self.replayed_spans = 0
        self.corrupt_segments = 0
        self.corrupt_records = 0
        self.checkpoints_rebuilt = 0
        self.pipeline_fsyncs = 0
        self.checkpoints = 0
        self.write_errors: dict[tuple[str, str], int] = {}  # (file, reason): the journal's, checkpoint's, carried
        self._journal_size = 0  # bytes of whole entries in the open journal
        self._failing = ""  # what the keeper could not write last ("" once it could again)
        # The carried traces (``carried.py``): the ticker's snapshot waits in ``_carry_outbox`` until
        # the checkpoint thread has appended it; ``_carried_at``: when the last one on disk was taken.
        self.carried = CarriedFile(self.directory / CARRIED, sync=settings.fsync != "never")
        self.carried_in: list[bytes] = []  # the requests of the carried traces found at start
        self._carry_lock = threading.Lock()
        self._carry_outbox: _CarrySnapshot | None = None
        self._carry_due = 0.0
        self._carried_at = float("-inf")
        self._prior_carried: set[bytes] = set()  # carried traces found at start that were decided before
        self._opened = False
        self._started = False
        self.carried_traces_replayed = 0

    # --- start-up ---------------------------------------------------------------------------------

    def recover(self) -> Iterator[Record]:
        """``open`` (if not yet), then yield every record after the checkpoint."""
        if not self._opened:
            self.open()
        handled = last = self._checkpointed
        segments = _numbered(self.directory, SEGMENT_PREFIX, SEGMENT_SUFFIX)
        self.shared.set(IntakeLogShared.SIZE, sum(path.stat().st_size for _, path in segments))
        for first, path in segments:
            last = max(last, first - 1)
            scan = read_segment(path, first)
            records = scan.records
            if scan.damaged or scan.valid_end != scan.size:
                self.corrupt_segments += 1
                self.corrupt_records += scan.damaged
                log.warning("intake log: %s holds %d torn or corrupt records (%d valid kept)", path.name,
                            scan.damaged, len(records))
                self._cut_tail(path, scan)
            for record in records:
                last = max(last, record.seq)
                if record.seq <= handled:
                    continue
                self.replayed_requests += 1
                self.replayed_spans += record.spans
                yield record
        self._replay_end = self._journal_pin = last
        self._next_seq = last + 1
        self.shared.set(IntakeLogShared.LAST_SEQ, last)
        if self.replayed_requests:
            log.warning("intake log: replayed %d requests (%d spans) logged after checkpoint %d",
                        self.replayed_requests, self.replayed_spans, handled)

    def open(self) -> None:
        """Take the locks, read the checkpoint, the journals and the carried traces (``carried_in``:
        their requests, to buffer again before the replay)."""
        self._opened = True
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        if self._keeper_lock < 0:
            self._keeper_lock = lock_file(directory / KEEPER_LOCK, timeout_s=0)
        os.close(lock_file(directory / WRITER_LOCK, timeout_s=15))  # the previous receiver process has exited
        checkpointed = read_checkpoint(directory)
        if checkpointed is None:
            # A segment is deleted only once the checkpoint covers it: the oldest one left starts
            # after the last checkpoint written. Replaying from there may measure again what the
            # damaged checkpoint had covered, but loses nothing, and the service starts.
            found = _numbered(directory, SEGMENT_PREFIX, SEGMENT_SUFFIX)
            checkpointed = found[0][0] - 1 if found else 0
            self.checkpoints_rebuilt += 1
            log.error("intake log: %s is not a valid checkpoint; rebuilt from the segments: replaying after %d",
                      directory / CHECKPOINT, checkpointed)
            self._write_checkpoint(checkpointed)
        handled = checkpointed
        self._reached = self._handled = self._checkpointed = handled
        self._replay_end = 1 << 62  # the old decisions stay needed until the replay is read and handled
        old_journals = _numbered(directory, JOURNAL_PREFIX, JOURNAL_SUFFIX)
        for _, path in old_journals:
            read_journal(path, self.prior)
        self._compact_journals(handled + 1, old_journals)
        self.carried_in, damaged = self.carried.load()
        if damaged:  # an append a crash cut (its spans are still in the segments), or damage
            self.corrupt_records += damaged
            log.warning("intake log: %s holds a torn or corrupt record: what follows it is not read",
                        self.carried.path.name)
        self.carried_traces_replayed = len(self.carried.traces)
        self._prior_carried = {trace_id for trace_id in self.carried.traces if trace_id in self.prior}

    def _cut_tail(self, path: Path, scan: SegmentScan) -> None:
        """No valid record follows ``valid_end``: cut the garbage there, so that nothing is ever
        appended behind it (a segment with no valid record at all goes)."""
        if scan.valid_end == scan.size:
            return
        try:
            if scan.valid_end == 0:
                path.unlink()
            else:
                os.truncate(path, scan.valid_end)
        except OSError as exc:
            log.error("intake log: cannot cut the torn tail of %s: %s", path.name, exc)
            return
        self.shared.add(IntakeLogShared.SIZE, scan.valid_end - scan.size)

    def receiver_settings(self) -> IntakeLogSettings:
        """What the receiver process's writer needs; its first record follows the last one on disk."""
        return IntakeLogSettings(self.settings.directory, self.settings.fsync, self.settings.fsync_interval_s,
                                 self.settings.segment_bytes, self.settings.max_bytes, self._next_seq,
                                 self.settings.min_free_bytes, self.settings.redaction)

    def start(self) -> None:
        self._started = True
        self._thread = threading.Thread(target=self._run, name="otel-llm-intake-log", daemon=True)
        self._thread.start()

    # --- tracking (reader thread, worker thread, ticker thread) ------------------------------------

    def arrived(self, seq: int | None = None) -> None:
        """The next logged request reached the pipeline (``seq``: a replayed one)."""
        if seq is None:
            seq = self._next_seq
        self._next_seq = seq + 1
        entry: list[Any] = [seq, None]
        self._marks.append(entry)
        self._to_process.append(entry)

    def processed(self) -> None:
        """The worker has buffered the oldest request it had (its late spans are handled by now)."""
        self._to_process.popleft()[1] = time.monotonic()
        if self._journal_buffer:  # late spans measured, traces completed early (num_traces)
            self.flush_journal()

    def ticked(self, started: float,
               overdue: Callable[[float, Collection[bytes]], list[PendingTrace]] | None = None) -> None:
        """A tick that started at ``started`` (under the pipeline's tick lock) has completed every
        trace first seen ``decision_wait`` before it, but those still pending: held for a call in
        flight (``processors.tail_sampling.max_open_call_wait``) or buffered again at start.
        ``overdue(seen_before, trace_ids)`` gives copies of those and of the carried ones: their new
        spans are carried (``carried.py``), then every request processed before the cutoff is handled
        once its kept traces are written. Without ``overdue`` (nothing buffered: the keeper's tests)
        the requests are handled at once."""
        self.flush_journal()
        cutoff = started - self._decision_wait_s
        self._advance(cutoff)
        if overdue is None:
            with self._carry_lock:
                self._publish(self._reached, started)
            return
        now = time.monotonic()
        with self._carry_lock:
            if not self._started or self._carry_outbox is not None or now < self._carry_due:
                return
            self._carry_due = now + self.CHECKPOINT_EVERY_S
            snapshot = self._carry_snapshot(overdue(cutoff, self.carried.traces.keys()), self._reached, started)
            if snapshot.carried or snapshot.left:
                self._carry_outbox = snapshot  # the checkpoint thread writes it, then publishes
            else:
                self._publish(snapshot.handled, started)

    def _carry_snapshot(self, traces: list[PendingTrace], handled: int, taken_at: float) -> _CarrySnapshot:
        """What ``traces`` (pending past the cutoff, or carried) add to the carried file: their spans
        not carried yet; and a tombstone for each carried trace no longer pending."""
        known = self.carried.traces
        carried: list[CarriedSpans] = []
        pending: set[bytes] = set()
        for trace in traces:
            trace_id = trace.trace_id
            pending.add(trace_id)
            entry = known.get(trace_id)
            new = [span for span_id, span in trace.spans.items() if entry is None or span_id not in entry.span_ids]
            if new:
                carried.append(CarriedSpans(trace_id, encode_spans(new, self.settings.redaction),
                                            {span.span_id for span in new}))
        left = [trace_id for trace_id in known if trace_id not in pending]
        return _CarrySnapshot(handled, taken_at, carried, left)

    def carry(self, traces: list[PendingTrace]) -> None:
        """Carry ``traces`` now (taken over at start: their handover is deleted once this returns).
        Raises ``OSError``."""
        with self._carry_lock:
            snapshot = self._carry_snapshot(traces, self._handled, self._carried_at)
            self.carried.append(snapshot.carried, [])

    def _write_carried(self) -> bool:
        """The ticker's snapshot onto disk, then what was handled when it was taken published;
        False on a write error (counted: the next snapshot has the same spans again)."""
        with self._carry_lock:
            snapshot = self._carry_outbox
        if snapshot is None:
            return True
        try:
            self.carried.append(snapshot.carried, snapshot.left)
        except OSError as exc:
            with self._carry_lock:
                self._carry_outbox = None
            self._write_failed("carried", exc)
            return False
        self._write_succeeded("carried")
        with self._carry_lock:
            self._prior_carried.difference_update(snapshot.left)
            self._carry_outbox = None
            self._publish(snapshot.handled, snapshot.taken_at)
        return True

    def _publish(self, handled: int, taken_at: float) -> None:
        """Under ``_carry_lock``: every record <= ``handled`` may be checkpointed; the carried file
        holds every trace pending at ``taken_at``."""
        self._handled = max(self._handled, handled)
        self._carried_at = max(self._carried_at, taken_at)
        if self.prior and self._handled >= self._replay_end and not self._prior_carried:
            self.prior = {}  # every replayed request is handled: the old decisions are needed no more

    def _advance(self, cutoff: float) -> None:
        marks = self._marks
        reached = self._reached
        while marks:
            at = marks[0][1]
            if at is None or at > cutoff:
                break
            reached = marks.popleft()[0]
        self._reached = reached

    # --- the decision journal ------------------------------------------------------------------------

    def _compact_journals(self, first_seq: int, old: list[tuple[int, Path]]) -> None:
        """One journal holding every decision of the previous runs (needed until every replayed
        request is handled), opened for this run's decisions. On a full disk the old journals are
        kept as they are instead (all of them pinned the same way): the start must not need room,
        or a log that filled its disk could never be replayed to free it."""
        path = self.directory / journal_name(first_seq)
        sync = self.settings.fsync != "never"
        self._journal_pin = 1 << 62  # set to the last replayed record once the replay is read
        try:
            with replacing(path, sync) as f:
                for trace_id, prior in self.prior.items():
                    f.write(self._decided_entry(trace_id, prior.keep, prior.rate_limited, prior.policy,
                                                prior.threshold, prior.measured))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            log.warning("intake log: no room to compact its %d journals (%s): kept as they are", len(old), exc)
            self._journals = [(0, old_path) for _, old_path in old if old_path != path]
            for _, old_path in self._journals:  # the previous runs' decisions: the pin keeps them
                self._journal_switched[old_path] = float("-inf")
            self._open_journal(first_seq)
            return
        self.pipeline_fsyncs += sync
        for _, old_path in old:  # once the compacted one is in place: a crash in between loses no decision
            if old_path != path:
                old_path.unlink(missing_ok=True)
        self._journals = []
        self._open_journal(first_seq)

    def _open_journal(self, first_seq: int | None = None) -> None:
        """A new journal, named after the first request not yet processed (``first_seq`` at start):
        every decision in the older journals is about requests before it."""
        with self._journal_lock:
            self._flush_locked()  # into the journal being closed, before the new one's name is chosen
            if first_seq is None:
                first_seq = self._first_unprocessed()
            path = self.directory / journal_name(first_seq)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
            old, self._journal_fd = self._journal_fd, fd
            self._journal_size = os.fstat(fd).st_size
            self._journal_opened = time.monotonic()
            self._journal_switched.setdefault(path, self._journal_opened)
        if old >= 0:
            if self.settings.fsync != "never":
                os.fdatasync(old)
                self.pipeline_fsyncs += 1
            os.close(old)
        if not self._journals or self._journals[-1][1] != path:
            self._journals.append((first_seq, path))

    def _journal(self, entry: bytes) -> None:
        with self._journal_lock:
            self._journal_buffer.append(entry)

    def flush_journal(self) -> bool:
        """Write the decisions made since the last call (one write per tick or request, not per
        trace). Never raises: a write error is counted, the entries stay for the next call, ingest
        is refused and ``/readyz`` says why until a write succeeds (``problem``)."""
        with self._journal_lock:
            return self._flush_locked()

    def _flush_locked(self) -> bool:
        if not self._journal_buffer or self._journal_fd < 0:
            return True
        data = b"".join(self._journal_buffer)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._journal_fd, view):]
        except OSError as exc:
            try:  # no partial entry may stay in front of the next one
                os.ftruncate(self._journal_fd, self._journal_size)
            except OSError:
                pass
            self._write_failed("journal", exc)
            return False
        self._journal_buffer.clear()
        self._journal_size += len(data)
        self._write_succeeded("journal")
        return True

    def _write_failed(self, file: str, exc: OSError) -> None:
        key = (file, write_error_reason(exc))
        self.write_errors[key] = self.write_errors.get(key, 0) + 1
        if not self._failing:
            log.error("intake log: cannot write its %s: %s; ingest refused (retryable) until it can", file, exc)
        self._failing = file
        self.shared.set(IntakeLogShared.KEEPER_ERRNO, exc.errno or 0)
        self.shared.set(IntakeLogShared.KEEPER_ERROR_AT, time.monotonic_ns() or 1)

    def _write_succeeded(self, file: str) -> None:
        if self._failing == file:
            self._failing = ""
            self.shared.set(IntakeLogShared.KEEPER_ERROR_AT, 0)
            log.warning("intake log: its %s is written again", file)

    def problem(self) -> str | None:
        """Why the intake log cannot take requests right now (for ``/readyz``), or None."""
        shared = IntakeLogShared
        where = f"receivers.otlp.intake_log ({self.directory})"
        if self.shared[shared.KEEPER_ERROR_AT]:
            return (f"{where} cannot write its {self._failing or 'files'} "
                    f"({errno.errorcode.get(self.shared[shared.KEEPER_ERRNO], 'error')})")
        at = self.shared[shared.WRITER_ERROR_AT]
        if at and time.monotonic_ns() - at < ERROR_READINESS_S * 1e9:
            return f"{where} cannot be written ({errno.errorcode.get(self.shared[shared.WRITER_ERRNO], 'error')})"
        floor = self.settings.min_free_bytes
        if floor:  # what the writer checks before each request: below it, every one is refused
            try:
                free = free_bytes(self.directory)
            except OSError:
                return None
            if free - LOW_DISK_RESERVE < floor:
                return (f"{where} has {free >> 20} MiB free, below min_free_mib ({floor >> 20} MiB): requests are "
                        "refused (intake_log_full) until there is room")
        return None

    def decided(self, trace_id: bytes, keep: bool, rate_limited: bool, policy: str, threshold: str,
                measured: Collection[bytes]) -> None:
        if len(trace_id) != 16:
            return
        self._journal(self._decided_entry(trace_id, keep, rate_limited, policy, threshold, measured))

    @staticmethod
    def _decided_entry(trace_id: bytes, keep: bool, rate_limited: bool, policy: str, threshold: str,
                       measured: Collection[bytes]) -> bytes:
        policy_bytes = policy.encode()[:255]
        threshold_bytes = threshold.encode("ascii", "replace")[:255]
        ids = [span_id for span_id in measured if len(span_id) == 8][:65535]
        return (_DECIDED.pack(b"D", trace_id, keep, rate_limited, len(policy_bytes), len(threshold_bytes), len(ids))
                + policy_bytes + threshold_bytes + b"".join(ids))

    def measured_late(self, trace_id: bytes, span_id: bytes) -> None:
        if len(trace_id) == 16 and len(span_id) == 8:
            self._journal(_MEASURED.pack(b"M", trace_id, span_id))

    # --- checkpoints and deletion --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.CHECKPOINT_EVERY_S):
            try:
                self.checkpoint()
            except OSError as exc:  # counted; ingest is refused until the next checkpoint succeeds
                self._write_failed("checkpoint", exc)
            except Exception:  # keep checkpointing: a stuck log only fills up and refuses (counted)
                log.exception("intake log checkpoint failed")

    def checkpoint(self, final: bool = False, barrier_timeout_s: float = 1.0) -> int:
        """Persist the handled prefix and delete what it covers; returns the checkpointed sequence number."""
        if not self._write_carried():
            return self._checkpointed
        target = self._handled
        if target > self._checkpointed or final or self._failing == "checkpoint":
            for barrier in self.barriers:
                if not barrier(barrier_timeout_s):
                    return self._checkpointed  # kept traces still waiting to be written: next time
            if not self._sync_journal(final):
                return self._checkpointed  # the decisions must be on disk before the requests are handled
            self._write_checkpoint(target)
            self._checkpointed = target
            self.checkpoints += 1
            self._write_succeeded("checkpoint")
            if final:  # every trace has left the buffer (decided and journaled, or handed over)
                self.carried.remove()
                self._prior_carried = set()
                self._carried_at = float("inf")
        self._delete_covered(final)
        if time.monotonic() - self._journal_opened >= self.JOURNAL_ROTATE_S and not final:
            self._open_journal()
        return self._checkpointed

    def _first_unprocessed(self) -> int:
        try:
            return self._to_process[0][0]
        except IndexError:
            return self._next_seq

    def _sync_journal(self, final: bool) -> bool:
        policy = self.settings.fsync
        if not self.flush_journal():
            return False
        if policy == "never":
            return True
        now = time.monotonic()
        if policy == "always" or final or now - self._last_fsync >= self.settings.fsync_interval_s:
            with self._journal_lock:
                fd = self._journal_fd
                if fd >= 0:
                    os.fdatasync(fd)
                    self.pipeline_fsyncs += 1
            self._last_fsync = now
        return True

    def _write_checkpoint(self, handled: int) -> None:
        head = _CHECKPOINT_MAGIC + handled.to_bytes(8, "little")
        data = _CHECKPOINT.pack(_CHECKPOINT_MAGIC, handled, zlib.crc32(head))
        sync = self.settings.fsync != "never"
        try:
            with replacing(self.directory / CHECKPOINT, sync) as f:
                f.write(data)
            self.pipeline_fsyncs += sync
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # A full filesystem has no block for a new file, but the old checkpoint's block is
            # there: overwrite it in place (a torn one is rebuilt from the segments at start).
            fd = os.open(self.directory / CHECKPOINT, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.pwrite(fd, data, 0)
                if sync:
                    os.fdatasync(fd)
                    self.pipeline_fsyncs += 1
            finally:
                os.close(fd)

    def _delete_covered(self, final: bool) -> None:
        handled = self._checkpointed
        segments = _numbered(self.directory, SEGMENT_PREFIX, SEGMENT_SUFFIX)
        for index, (first, path) in enumerate(segments):
            if index + 1 < len(segments):
                last = segments[index + 1][0] - 1
            elif final:  # the writer is gone: its last record is known
                last = max(self.shared[IntakeLogShared.LAST_SEQ], first - 1)
            else:
                break  # the segment being written
            if last > handled:
                break
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            self.shared.add(IntakeLogShared.SIZE, -size)
        # A journal is needed while a request processed before the next journal opened is unhandled.
        # The first one, after a replay, holds the previous runs' decisions: kept until every
        # replayed request is handled.
        # A carried trace decided in a journal has its tombstone once a snapshot taken after that
        # journal was closed is on disk; a carried trace decided before the crash needs the first
        # journal (the previous runs' decisions) until it is decided again.
        while len(self._journals) >= 2 and self._journals[1][0] - 1 <= handled and \
                (self._journal_pin is None or (handled >= self._journal_pin and not self._prior_carried)) and \
                self._journal_switched.get(self._journals[1][1], float("inf")) <= self._carried_at:
            self._journal_pin = None
            _, path = self._journals.pop(0)
            self._journal_switched.pop(path, None)
            path.unlink(missing_ok=True)
        if final and self._journals and handled >= self._next_seq - 1:
            with self._journal_lock:
                if self._journal_fd >= 0:
                    os.close(self._journal_fd)
                    self._journal_fd = -1
            for _, path in self._journals:
                path.unlink(missing_ok=True)
            self._journals = []

    def close(self) -> None:
        """After the pipeline has decided every pending trace and the store has flushed: a final
        checkpoint covers every request processed; what was not processed stays for the next start."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._advance(float("inf"))
        with self._carry_lock:  # the pipeline has decided or handed over every pending trace
            self._carry_outbox = None
            self._handled = max(self._handled, self._reached)
        try:
            self.checkpoint(final=True, barrier_timeout_s=10.0)
        except OSError as exc:
            self._write_failed("checkpoint", exc)
            log.error("intake log: final checkpoint failed: %s; the next start replays from the previous one", exc)
        with self._journal_lock:
            if self._journal_fd >= 0:
                os.close(self._journal_fd)
                self._journal_fd = -1
        if self._keeper_lock >= 0:
            os.close(self._keeper_lock)
            self._keeper_lock = -1

    @property
    def pending_requests(self) -> int:
        return max(0, self.shared[IntakeLogShared.LAST_SEQ] - self._checkpointed)


_LOG = "receivers.otlp.intake_log"
INTAKE_LOG_APPENDED_BYTES = TelemetryFamily("otel_llm_intake_log_appended_bytes", "counter",
                                   "Bytes appended to the intake log (records and their headers).", exposed_by=_LOG)
INTAKE_LOG_APPENDED_REQUESTS = TelemetryFamily("otel_llm_intake_log_appended_requests", "counter",
                                      "Admitted requests appended to the intake log before they were answered.",
                                      exposed_by=_LOG)
INTAKE_LOG_FSYNCS = TelemetryFamily("otel_llm_intake_log_fsyncs", "counter", "fdatasync calls on the intake log, by file.",
                           ("file",), _LOG, "`file`: `segment`, `journal_or_checkpoint`.")
INTAKE_LOG_FSYNC_ERRORS = TelemetryFamily("otel_llm_intake_log_fsync_errors", "counter",
                                 "fdatasync calls on segments that failed.", exposed_by=_LOG)
INTAKE_LOG_REFUSED_REQUESTS = TelemetryFamily(
    "otel_llm_intake_log_refused_requests", "counter",
    "Requests refused (retryably) because the intake log could not take them.", ("reason",), _LOG,
    "`reason`: `full`, `low_disk`, `write_error`; the receivers count the same under the reasons `intake_log_full` "
    "and `intake_log_error` of `otel_llm_receiver_refused_requests_total`.")
INTAKE_LOG_ATTRIBUTES_REDACTED = TelemetryFamily(
    "otel_llm_intake_log_attributes_redacted", "counter",
    "Attributes removed or reduced (processors.redaction's rules) from admitted requests before they were written "
    "to the intake log, by reason.", ("reason",), _LOG)
INTAKE_LOG_WRITE_ERRORS = TelemetryFamily(
    "otel_llm_intake_log_write_errors", "counter", "Writes to the intake log that failed, by file and reason.",
    ("file", "reason"), _LOG, "`file`: `segment`, `journal`, `checkpoint`, `carried`.")
INTAKE_LOG_WRITABLE = TelemetryFamily(
    "otel_llm_intake_log_writable", "gauge",
    "1 while the intake log can be written, 0 while ingest is refused for a write error.", exposed_by=_LOG)
INTAKE_LOG_REPLAYED_REQUESTS = TelemetryFamily("otel_llm_intake_log_replayed_requests", "counter",
                                      "Requests replayed from the intake log at start.", exposed_by=_LOG)
INTAKE_LOG_REPLAYED_SPANS = TelemetryFamily("otel_llm_intake_log_replayed_spans", "counter",
                                   "Spans in the requests replayed from the intake log at start.", exposed_by=_LOG)
INTAKE_LOG_REPLAYED_CARRIED_TRACES = TelemetryFamily(
    "otel_llm_intake_log_replayed_carried_traces", "counter",
    "Traces found in the intake log's carried file at start (pending past decision_wait at the crash) and "
    "buffered again.", exposed_by=_LOG)
INTAKE_LOG_CARRIED_TRACES = TelemetryFamily(
    "otel_llm_intake_log_carried_traces", "gauge",
    "Pending traces whose spans the intake log carries past its checkpoint (held for a call in flight, or "
    "buffered again at start).", exposed_by=_LOG)
INTAKE_LOG_CARRIED_BYTES = TelemetryFamily(
    "otel_llm_intake_log_carried_bytes", "gauge",
    "Bytes of the intake log's carried file (its live traces, and dead records until it is compacted).",
    exposed_by=_LOG)
INTAKE_LOG_CORRUPT_SEGMENTS = TelemetryFamily("otel_llm_intake_log_corrupt_segments", "counter",
                                     "Segments found at start holding a torn or corrupt record.", exposed_by=_LOG)
INTAKE_LOG_CORRUPT_RECORDS = TelemetryFamily(
    "otel_llm_intake_log_corrupt_records", "counter",
    "Torn or corrupt records skipped at start (the reading resumes at the next valid one).", exposed_by=_LOG)
INTAKE_LOG_CHECKPOINT_REBUILDS = TelemetryFamily("otel_llm_intake_log_checkpoint_rebuilds", "counter",
                                        "Unreadable checkpoints found at start and rebuilt from the segments.",
                                        exposed_by=_LOG)
INTAKE_LOG_CHECKPOINTS = TelemetryFamily("otel_llm_intake_log_checkpoints", "counter", "Checkpoints written.",
                                exposed_by=_LOG)
INTAKE_LOG_SIZE_BYTES = TelemetryFamily("otel_llm_intake_log_size_bytes", "gauge", "Bytes of intake log segments on disk.",
                               exposed_by=_LOG)
INTAKE_LOG_MAX_SIZE_BYTES = TelemetryFamily("otel_llm_intake_log_max_size_bytes", "gauge",
                                   "receivers.otlp.intake_log.max_size_mib.", exposed_by=_LOG)
INTAKE_LOG_PENDING_REQUESTS = TelemetryFamily("otel_llm_intake_log_pending_requests", "gauge",
                                     "Logged requests not yet checkpointed as handled.", exposed_by=_LOG)


class IntakeLogCollector:
    """``otel_llm_intake_log_*`` on /metrics (a prometheus_client custom collector)."""

    def __init__(self, keeper: IntakeLogKeeper) -> None:
        self._keeper = keeper

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        keeper, shared = self._keeper, self._keeper.shared
        s = IntakeLogShared
        yield INTAKE_LOG_APPENDED_BYTES.collected(shared[s.APPENDED_BYTES])
        yield INTAKE_LOG_APPENDED_REQUESTS.collected(shared[s.APPENDED_REQUESTS])
        fsyncs = INTAKE_LOG_FSYNCS.collected()
        fsyncs.add_metric(["segment"], shared[s.FSYNCS])
        fsyncs.add_metric(["journal_or_checkpoint"], keeper.pipeline_fsyncs)
        yield fsyncs
        yield INTAKE_LOG_FSYNC_ERRORS.collected(shared[s.FSYNC_ERRORS])
        refused = INTAKE_LOG_REFUSED_REQUESTS.collected()
        refused.add_metric(["full"], shared[s.REFUSED_FULL])
        refused.add_metric(["low_disk"], shared[s.REFUSED_LOW_DISK])
        refused.add_metric(["write_error"], shared[s.REFUSED_ERROR])
        yield refused
        redacted = INTAKE_LOG_ATTRIBUTES_REDACTED.collected()
        for i, reason in enumerate(s.REDACTION_REASONS):
            redacted.add_metric([reason], shared[s.REDACTED + i])
        yield redacted
        errors = INTAKE_LOG_WRITE_ERRORS.collected()
        for index, reason in enumerate(WRITE_ERROR_REASONS):
            errors.add_metric(["segment", reason], shared[s.WRITE_ERRORS + index])
            for file in ("journal", "checkpoint", "carried"):
                errors.add_metric([file, reason], keeper.write_errors.get((file, reason), 0))
        yield errors
        yield INTAKE_LOG_WRITABLE.collected(0 if keeper.problem() else 1)
        yield INTAKE_LOG_REPLAYED_REQUESTS.collected(keeper.replayed_requests)
        yield INTAKE_LOG_REPLAYED_SPANS.collected(keeper.replayed_spans)
        yield INTAKE_LOG_REPLAYED_CARRIED_TRACES.collected(keeper.carried_traces_replayed)
        yield INTAKE_LOG_CARRIED_TRACES.collected(len(keeper.carried.traces))
        yield INTAKE_LOG_CARRIED_BYTES.collected(keeper.carried.size)
        yield INTAKE_LOG_CORRUPT_SEGMENTS.collected(keeper.corrupt_segments)
        yield INTAKE_LOG_CORRUPT_RECORDS.collected(keeper.corrupt_records)
        yield INTAKE_LOG_CHECKPOINT_REBUILDS.collected(keeper.checkpoints_rebuilt)
        yield INTAKE_LOG_CHECKPOINTS.collected(keeper.checkpoints)
        yield INTAKE_LOG_SIZE_BYTES.collected(shared[s.SIZE])
        yield INTAKE_LOG_MAX_SIZE_BYTES.collected(keeper.settings.max_bytes)
        yield INTAKE_LOG_PENDING_REQUESTS.collected(keeper.pending_requests)
