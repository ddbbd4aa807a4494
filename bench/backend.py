"""Where the benchmark's stacks keep their state, and how many bytes a run writes there (checkpoint traffic).

- The file backend (the default, `file://<work dir>/state`): the engine rewrites the
  whole snapshot after each step. The bytes are the sizes of every file version
  written under the backend directory during the run, as inotify reports them
  (bench/fswatch.py); the engine's event logs, which the benchmark keeps in that
  directory's `events/`, are left out.
- A PostgreSQL backend (`--backend postgres://...` or `lab-postgres`): the WAL the
  server generated over the run (`pg_current_wal_lsn()` before and after, through
  `psql`), i.e. what the server wrote for the checkpoints, with its own overhead;
  other clients of the same server count too (the runs of several stacks at once
  share it on purpose).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fswatch import WriteWatch

#: --backend lab-postgres[:RTT_MS]: the lab's own PostgreSQL server (lab/postgres.py, where it exists), started by the
#: benchmark, optionally behind a toxiproxy proxy adding RTT_MS to each round trip.
LAB_POSTGRES = "lab-postgres"


def backend_kind(url: str) -> str:
    """A backend as the report names it: its URL's scheme (file, postgres); a result recorded before results kept
    their backend says so."""
    return url.split(":", 1)[0] or "backend not recorded"


def wal_bytes(lsn_before: str, lsn_after: str) -> int:
    """Bytes of WAL between two LSNs as PostgreSQL prints them ('16/B374D848': high and low 32 bits, hex)."""
    def value(lsn: str) -> int:
        high, _, low = lsn.strip().partition("/")
        return (int(high, 16) << 32) | int(low, 16)

    return value(lsn_after) - value(lsn_before)


@dataclass(frozen=True)
class Backend:
    """The state backend of every stack of one benchmark run."""

    url: str
    """`file://<dir>` or `postgres://user:password@host:port/database`."""
    note: str = ""
    """What else the report should say about it (the lab's server, the round trip added in front of it)."""

    @property
    def is_file(self) -> bool:
        return self.url.startswith("file://")

    @property
    def root(self) -> Path:
        """The file backend's directory."""
        return Path(self.url.removeprefix("file://"))

    @property
    def kind(self) -> str:
        return backend_kind(self.url)

    @property
    def shown(self) -> str:
        """The URL without its password, for the report."""
        scheme, sep, rest = self.url.partition("://")
        credentials, at, host = rest.rpartition("@")
        if not at or ":" not in credentials:
            return self.url
        return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"

    def stack_name(self, name: str, run_id: str) -> str:
        """A stack name for this run. The file backend is emptied at setup; another backend keeps earlier runs'
        stacks, so the run's id goes into the name and `stack select --create` never picks up an old state."""
        return name if self.is_file else f"{name}-{run_id}"

    def position(self) -> str | None:
        """Where the backend's write log is now: the WAL LSN of a PostgreSQL server; None for the file backend
        (its bytes come from the counters) or when the server cannot be asked."""
        if self.is_file:
            return None
        done = subprocess.run(["psql", self.url, "-Atc", "SELECT pg_current_wal_lsn()"], capture_output=True,
                              text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 and "/" in done.stdout else None

    def watch(self) -> contextlib.AbstractContextManager[WriteWatch | None]:
        """Around a run: the file backend's directory watched for what is written (none for another backend)."""
        return WriteWatch(self.root, skip=("events",)) if self.is_file else contextlib.nullcontext()

    def written(self, watched: WriteWatch | None, before: str | None) -> int | None:
        """Bytes the run wrote to the backend: see the module docstring. None when it cannot be told."""
        if watched is not None:
            return None if watched.overflowed else watched.bytes
        after = self.position()
        return None if before is None or after is None else wal_bytes(before, after)


def lab_postgres_rtt(url: str) -> int:
    """The round trip added in front of the lab's server: 'lab-postgres:10' -> 10, 'lab-postgres' -> 0."""
    _, _, rtt = url.partition(":")
    if rtt and not (rtt.isdigit() and int(rtt) % 2 == 0):
        raise ValueError(f"{url!r}: give lab-postgres or lab-postgres:<even milliseconds>, e.g. lab-postgres:10")
    return int(rtt or 0)


def start_lab_postgres(url: str, pki_dir: Path, toxiproxy: Callable[[], Any]) -> tuple[Backend, Any]:
    """Start lab/postgres.py's server for `--backend lab-postgres[:RTT_MS]`; (its backend, the server to stop).

    Its password goes into this process's environment (PGPASSWORD), which the CLI and `psql` inherit.
    """
    rtt = lab_postgres_rtt(url)
    if importlib.util.find_spec("lab.postgres") is None:
        raise RuntimeError("--backend lab-postgres needs lab/postgres.py (the PostgreSQL lab server), which this "
                           "checkout lacks; give a postgres:// URL of a server of your own instead")
    server = importlib.import_module("lab.postgres").Postgres(pki_dir).start()
    os.environ.update(server.client_env())
    note = f"lab/postgres.py's server, behind toxiproxy adding {rtt} ms to each round trip" if rtt else \
        "lab/postgres.py's server, on loopback"
    return Backend(server.behind(toxiproxy(), round_trip_ms=rtt) if rtt else server.url, note), server
