"""The on-disk sending queue (``sending_queue.storage``), as the Collector exporterhelper's
persistent queue: what a queued trace exporter accepted survives a SIGKILL and a restart.

On-disk queue (``sending_queue.storage`` = a directory, created if missing)
    Each accepted request is written to ``<seq>-<unix_ns>.otlpq`` (temp file, fsync, rename,
    directory fsync) before ``submit`` returns True, and deleted once the backend acknowledged it
    or it was dropped for good. ``start()`` first loads the files already there, oldest first, so a
    SIGKILL and restart delivers what was queued (at least once: a request in flight at the crash
    may be sent again). The files count towards ``queue_size``; if more than ``queue_size`` were
    left, all are still replayed and new submits are refused until the queue drains below the
    bound. A file that is truncated, fails its CRC or has a bad header is counted in
    ``dropped_spans_total`` / ``dropped_requests_total{reason="corrupt_persisted"}`` and renamed
    ``*.corrupt`` for inspection, never loaded again. The directory is locked (``flock`` on
    ``.lock``) so two exporters cannot share it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from otel_llm.internal.files import create_exclusive

log = logging.getLogger(__name__)


@dataclass(eq=False)
class QueueItem:
    """One export request of the sending queue: serialized once, and its file when it is on disk."""

    seq: int
    data: bytes
    spans: int
    path: Path | None = None
    done: bool = False


class PersistentQueue:
    """One file per request: ``<seq:016d>-<unix_ns:019d>.otlpq`` = header + serialized request."""

    HEADER = struct.Struct("<4sIQI")  # magic, span count, payload length, crc32(payload)
    MAGIC = b"OLQ1"
    SUFFIX = ".otlpq"
    TMP_PREFIX = ".tmp-"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OSError(f"sending_queue.storage: cannot use {directory}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise OSError(f"sending_queue.storage: {directory} is in use by another exporter") from None
            raise
        max_seq = 0
        for entry in os.scandir(directory):
            if entry.name.startswith(self.TMP_PREFIX):
                # An interrupted write: its submit never returned True, so nothing was promised.
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
                continue
            seq = self._seq_of(entry.name)
            if seq is not None:
                max_seq = max(max_seq, seq)
        self.next_seq = max_seq + 1

    @classmethod
    def _seq_of(cls, name: str) -> int | None:
        if not name.endswith(cls.SUFFIX):
            return None
        head = name[: -len(cls.SUFFIX)].split("-", 1)[0]
        return int(head) if head.isdigit() else None

    PROBE = ".probe"
    PROBE_BYTES = 4096

    def probe(self) -> None:
        """Can a request be written? One block written and removed again; raises ``OSError`` (a full
        disk: ENOSPC) when not."""
        path = self.directory / self.PROBE
        fd = create_exclusive(path)
        try:
            os.write(fd, bytes(self.PROBE_BYTES))
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)

    def write(self, seq: int, data: bytes, spans: int) -> Path:
        name = f"{seq:016d}-{time.time_ns():019d}{self.SUFFIX}"
        final = self.directory / name
        tmp = self.directory / (self.TMP_PREFIX + name)
        header = self.HEADER.pack(self.MAGIC, min(spans, 0xFFFFFFFF), len(data), zlib.crc32(data))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(header + data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._fsync_dir()
        return final

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(self, below_seq: int) -> tuple[list[QueueItem], list[tuple[Path, int, str]]]:
        """Files left by an earlier run (sequence < ``below_seq``), oldest first; and the corrupt ones."""
        named = []
        for entry in os.scandir(self.directory):
            seq = self._seq_of(entry.name)
            if seq is not None and seq < below_seq and entry.is_file():
                named.append((seq, entry.name))
        named.sort()
        items: list[QueueItem] = []
        corrupt: list[tuple[Path, int, str]] = []
        for seq, name in named:
            path = self.directory / name
            try:
                raw = path.read_bytes()
            except OSError as exc:
                corrupt.append((path, 0, f"unreadable: {exc.strerror or exc}"))
                continue
            problem = ""
            spans = 0
            if len(raw) < self.HEADER.size:
                problem = f"truncated header ({len(raw)} bytes)"
            else:
                magic, spans, length, crc = self.HEADER.unpack_from(raw)
                payload = raw[self.HEADER.size:]
                if magic != self.MAGIC:
                    problem, spans = "not an otel-llm queue file", 0
                elif len(payload) != length:
                    problem = f"truncated payload ({len(payload)} of {length} bytes)"
                elif zlib.crc32(payload) != crc:
                    problem = "checksum mismatch"
            if problem:
                corrupt.append((path, spans, problem))
                continue
            items.append(QueueItem(seq, payload, spans, path))
        return items, corrupt

    @staticmethod
    def quarantine(path: Path) -> None:
        try:
            os.replace(path, path.with_name(path.name + ".corrupt"))
        except OSError:
            try:
                os.unlink(path)
            except OSError:
                pass

    @staticmethod
    def remove(path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot delete acknowledged queue file %s: %s (it will be sent again after a restart)",
                        path, exc.strerror or exc)

    def close(self) -> None:
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(self._lock_fd)
