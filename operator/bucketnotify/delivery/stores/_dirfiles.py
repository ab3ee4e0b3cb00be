"""The files of the directory store, with plain descriptors: paths (made once and
remembered: a reserve looks up every shard's lock, and building the paths anew showed in
the store's profile), flock, durable writes and whole-file reads."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.stores._format import check_queue_name
from bucketnotify.delivery.stores._ring import write_all_blocking

__all__ = [
    "LockBusy",
    "TooManyFiles",
    "create_marker",
    "deleted_queue",
    "flock",
    "fsync_dir",
    "in_queue_dir",
    "lock_path",
    "names",
    "new_tmp",
    "queue_dir",
    "read_file",
    "replace_durably",
    "unlink",
    "write_tmp",
]


@functools.lru_cache(maxsize=1024)
def queue_dir(root: Path, queue: QueueName) -> Path:
    check_queue_name(queue)
    return root / queue.namespace / queue.topic


@functools.lru_cache(maxsize=16384)
def in_queue_dir(root: Path, queue: QueueName, name: str) -> Path:
    return queue_dir(root, queue) / name


@functools.lru_cache(maxsize=16384)
def lock_path(root: Path, queue: QueueName, name: str) -> Path:
    check_queue_name(queue)
    return root / ".locks" / queue.namespace / queue.topic / f"{name}.lock"


def create_marker(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def names(directory: Path) -> list[str]:
    """Sorted names in a directory; none when it does not exist (a deleted queue)."""
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


class LockBusy(Exception):
    """The lock is held by another open file (``flock(..., wait=False)``)."""


class TooManyFiles(Exception):
    """More batch files than a read on the event loop may take (``INLINE_FILES``)."""


@contextlib.contextmanager
def flock(path: Path, *, shared: bool = False, wait: bool = True) -> Iterator[int]:
    """An flock on ``path``; the descriptor is opened per use, so threads of one process
    exclude each other too (flock locks belong to the open file, not the process)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:  # the queue's first lock
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, operation if wait else operation | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockBusy(str(path)) from None
        yield fd
    finally:
        os.close(fd)  # releases the lock


def deleted_queue() -> contextlib.suppress:
    """A queue deleted under a reader or the owner: its files vanish mid-way (``delete``
    moves the whole directory), and what was being read or rewritten is gone with it."""
    return contextlib.suppress(FileNotFoundError)


# Plain descriptors, not Python file objects: a file object costs an fstat, an lseek and an
# isatty ioctl besides, and each system call in a store thread contends for the GIL.


def read_file(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        chunks = [os.read(fd, size + 1)]
        # A read of a regular file is short only at its end: one read, unless it grew.
        if len(chunks[0]) > size:
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def new_tmp(directory: str) -> tuple[int, str]:
    """A new file of a name of its own in ``directory``, open for writing: ``mkstemp`` with
    less of its machinery (a commit makes one for every batch)."""
    while True:
        name = f"{directory}/w-{secrets.token_hex(8)}"
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), name
        except FileExistsError:
            continue


def write_tmp(directory: Path, data: bytes, *, sync: bool = True) -> Path:
    fd, name = tempfile.mkstemp(dir=directory, prefix="w-")
    try:
        try:
            write_all_blocking(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def replace_durably(path: Path, data: bytes) -> None:
    write_tmp(path.parent / ".tmp", data).rename(path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
