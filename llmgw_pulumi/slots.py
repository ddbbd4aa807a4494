"""Slots shared by the processes of one machine: at most N holders at once, each an exclusive flock on one of N
files, released by the kernel if a process dies. The rollout (agents updating at once) and the signer command
(calls at once) both hold their slots here."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


@contextlib.contextmanager
def one_of(paths: Sequence[Path], wait: Callable[[], None]) -> Iterator[int]:
    """Hold the first free one of ``paths`` (each made 0600, never opened through a symlink); yields its index.

    While every one is held, ``wait()`` is called (it sleeps a while, or raises to stop waiting), then all are
    tried again.
    """
    while True:
        for k, path in enumerate(paths):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield k
                return
            finally:
                os.close(fd)  # releases the lock
        wait()
