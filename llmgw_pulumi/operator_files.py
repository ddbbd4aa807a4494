"""Files on the operator's machine that decide who logs in to the nodes or who signs for them.

The SSH key (``llmgw:ssh.privateKeyPath``) and the signer program
(``llmgw:signer.command[0]``) are trusted as they are found at each operation.
Another user of this machine who can read the key can log in to every node;
one who can write the key or the program, or any directory above it (and so
replace it), decides what logs in or what signs. ``exposed`` says so, with the
``chmod``/``chown`` that fixes it; the program refuses such a file before any
node is reached (a preview warns), and the command signer checks its program
again before each call.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid in (os.getuid(), 0)


def exposed(path: str | os.PathLike[str], *, secret: bool) -> tuple[str, str] | None:
    """(problem, fix) when a user other than this one (or root) can read ``path`` (``secret``: a private key) or
    write it or any directory above it; None when none can, or when ``path`` does not exist (said elsewhere).

    Symbolic links are followed: the file and directories checked are the real ones. A directory others may
    write but with the sticky bit (/tmp) is safe: only a file's owner may replace a file in it.
    """
    real = Path(os.path.realpath(path))
    try:
        st = real.stat()
    except OSError:
        return None
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    if not _owner_ok(st):
        return (f"{real} belongs to another user (uid {st.st_uid}), who can change it",
                f"chown {user} {real}, or use a copy of your own")
    mode = stat.S_IMODE(st.st_mode)
    if secret and mode & 0o077:
        return (f"{real} is open to group or others (mode {mode:04o}): they can read the key",
                f"chmod 600 {real}")
    if not secret and mode & 0o022:
        return (f"{real} is writable by group or others (mode {mode:04o}): they can change it",
                f"chmod go-w {real}")
    for directory in real.parents:
        try:
            dst = directory.stat()
        except OSError:
            continue
        if not _owner_ok(dst):
            return (f"{directory}, a directory above {real}, belongs to another user (uid {dst.st_uid}), who can "
                    "replace what is in it", f"move the file to a directory of your own, or chown {user} {directory}")
        if dst.st_mode & 0o022 and not dst.st_mode & stat.S_ISVTX:
            dmode = stat.S_IMODE(dst.st_mode)
            return (f"{directory}, a directory above {real}, is writable by group or others (mode {dmode:04o}): "
                    "they can replace what is in it", f"chmod go-w {directory}")
    return None
