"""Bytes written under a directory while a run lasts: every version of every file, counted when it is complete.

The file backend writes whole files (the checkpoint after each step, its backup,
the history, their `.attrs`), each as a new file renamed into place. Linux's
fanotify reports each close of a file that was written (FAN_CLOSE_WRITE) in a
marked directory with an open descriptor of that very file, so its size is the
size of the version just written even when the next one has replaced it by the
time the event is read. Directories made during the run (a stack's first history
directory) are marked as inotify reports them, each before it is listed; a file
found in the listing is counted at its listed size unless a close of it is
reported afterwards (then it was still being written: the event's version counts). Subdirectories named in `skip` are left out.
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
        self._marked: set[Path] = set()
        self._listed: dict[tuple[int, int], int] = {}
        """(device, inode) -> size of the files found in a new directory's listing. A close of one of them
        reported afterwards is that version (it may have been mid-write when listed): it replaces the listing's
        entry; the rest are counted at the end, as written before their directory was marked."""
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
        for size in self._listed.values():
            self._add(size)
        self._listed.clear()
        os.close(self._fan)
        os.close(self._inotify)

    def _watch_tree(self, top: Path, new: bool) -> None:
        """Mark ``top`` and every directory below it, each before it is listed: a directory or file made while
        this runs is then either in the listing or reported by its event (a file in both is counted once)."""
        if top in self.skip or top in self._marked:
            return
        self._marked.add(top)
        wd = self._libc.inotify_add_watch(self._inotify, bytes(top), IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)
        if wd >= 0:
            self._dirs[wd] = top
        self._libc.fanotify_mark(self._fan, FAN_MARK_ADD, FAN_CLOSE_WRITE | FAN_EVENT_ON_CHILD, AT_FDCWD, bytes(top))
        try:
            entries = list(os.scandir(top))
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                self._watch_tree(Path(entry.path), new)
            elif new:  # files closed before the mark was on
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    self._listed[self._key(st)] = st.st_size

    @staticmethod
    def _key(st: os.stat_result) -> tuple[int, int]:
        return st.st_dev, st.st_ino

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
                    self._listed.pop(self._key(st), None)
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
