"""Files written whole beside others and swapped in by a rename, in directories someone else may write to.

A fixed temporary name (``handover.tmp``) opened with ``O_TRUNC`` follows whatever is there: a symlink
planted under that name has its target overwritten by the next stop (issue 50 measured it). So the
temporary file is created exclusively and never through a link (``O_CREAT | O_EXCL | O_NOFOLLOW``); one
left by a stop cut short, or planted, is removed first (``unlink`` removes a link, never its target).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new name in ``directory`` survive a machine crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_exclusive(path: Path, mode: int = 0o600) -> int:
    """A new file at ``path``, never opened through a link; what was there (a file or a link) is
    removed first. Raises ``OSError`` if something takes the name again in between."""
    try:
        return os.open(path, _EXCLUSIVE, mode)
    except FileExistsError:
        path.unlink()  # a directory there raises: nothing is written
        return os.open(path, _EXCLUSIVE, mode)


@contextmanager
def replacing(path: Path, sync: bool = True) -> Iterator[BinaryIO]:
    """Write ``path`` whole: into ``<path>.tmp`` (``create_exclusive``), flushed (and with ``sync``
    fsync'd) and renamed over ``path`` when the block ends, the rename then fsync'd too. On an error
    the temporary file is removed and ``path`` is left as it was."""
    tmp = path.with_suffix(".tmp")
    fd = create_exclusive(tmp)
    try:
        with os.fdopen(fd, "wb") as file:
            yield file
            file.flush()
            if sync:
                os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    if sync:
        fsync_directory(path.parent)
