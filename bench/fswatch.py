"""Bytes written under a directory while a run lasts: every version of every file, counted when it is complete.

The file backend writes whole files (the checkpoint after each step, its backup,
the history, their `.attrs`), each as a new file renamed into place. Linux's
fanotify reports each close of a file that was written (FAN_CLOSE_WRITE) in a
marked directory with an open descriptor of that very file, so its size is the
size of the version just written even when the next one has replaced it by the
time the event is read. Directories made during the run (a stack's first history
directory) are marked as inotify reports them; what was closed in one before its
mark is counted from its files then. Subdirectories named in `skip` are left out.
A file rewritten in place (not replaced) twice before the watch reads the first
event counts once, at its last size (fanotify merges the two events): the DIY
backend's `.attrs` sidecars (about 200 bytes) may be undercounted so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import struct
import threading
from pathlib import Path
from types import TracebackType

IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
INOTIFY_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
FAN_CLASS_NOTIF, FAN_CLOEXEC, FAN_NONBLOCK = 0, 1, 2
FAN_MARK_ADD = 1
FAN_CLOSE_WRITE = 0x00000008
FAN_Q_OVERFLOW = 0x00004000
FAN_EVENT_ON_CHILD = 0x08000000
AT_FDCWD = -100
FANOTIFY_EVENT = struct.Struct("IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid


class WriteWatch:
    """`with WriteWatch(root) as w: ...` then `w.bytes` and `w.versions`; `w.overflowed` if events were lost."""

    def __init__(self, root: Path, skip: tuple[str, ...] = ()) -> None:
        self.root = root
        self.skip = {root / name for name in skip}
        self.bytes = 0
        self.versions = 0
        self.overflowed = False
        self._dirs: dict[int, Path] = {}
        self._listed: set[tuple[int, int, int, int]] = set()
        """(device, inode, mtime, size) of the files counted from a new directory's listing: not again by event."""
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        self._fan = self._inotify = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="backend-write-watch", daemon=True)

    def __enter__(self) -> WriteWatch:
        self._fan = self._libc.fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK,
                                             os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC)
        self._inotify = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fan < 0 or self._inotify < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init/inotify_init1 (the watch needs root)")
        self.root.mkdir(parents=True, exist_ok=True)
        self._watch_tree(self.root, new=False)
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()  # whatever arrived after the loop's last read
        os.close(self._fan)
        os.close(self._inotify)

    def _watch_tree(self, top: Path, new: bool) -> None:
        for d, subdirs, files in os.walk(top):
            path = Path(d)
            if path in self.skip:
                subdirs.clear()
                continue
            wd = self._libc.inotify_add_watch(self._inotify, bytes(path), IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)
            if wd >= 0:
                self._dirs[wd] = path
            self._libc.fanotify_mark(self._fan, FAN_MARK_ADD, FAN_CLOSE_WRITE | FAN_EVENT_ON_CHILD, AT_FDCWD, bytes(path))
            if new:  # files closed before the mark was on
                for name in files:
                    with contextlib.suppress(OSError):
                        st = os.stat(path / name)
                        self._listed.add(self._key(st))
                        self._add(st.st_size)

    @staticmethod
    def _key(st: os.stat_result) -> tuple[int, int, int, int]:
        return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size

    def _add(self, size: int) -> None:
        self.bytes += size
        self.versions += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fan, self._inotify], [], [], 0.05)
            if ready:
                self._drain()

    def _drain(self) -> None:
        self._drain_directories()
        while True:
            try:
                data = os.read(self._fan, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                length, _, _, _, mask, fd, _ = FANOTIFY_EVENT.unpack_from(data, offset)
                offset += length
                if mask & FAN_Q_OVERFLOW:
                    self.overflowed = True
                if fd >= 0:
                    try:
                        st = os.fstat(fd)
                    finally:
                        os.close(fd)
                    if self._key(st) in self._listed:
                        self._listed.discard(self._key(st))
                    else:
                        self._add(st.st_size)

    def _drain_directories(self) -> None:
        while True:
            try:
                data = os.read(self._inotify, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                wd, mask, _, length = INOTIFY_EVENT.unpack_from(data, offset)
                name = data[offset + INOTIFY_EVENT.size:offset + INOTIFY_EVENT.size + length].rstrip(b"\0").decode()
                offset += INOTIFY_EVENT.size + length
                parent = self._dirs.get(wd)
                if parent is not None and name and mask & IN_ISDIR:
                    self._watch_tree(parent / name, new=True)
