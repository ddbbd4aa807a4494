"""A PostgreSQL server of the lab's own, as a team keeps Pulumi state: `pulumi login postgres://...`.

Debian's server (the postgresql package; scripts/install.sh installs it when
missing), in a fresh cluster of its own: `initdb` into a directory of its own,
listening on loopback only, TLS with a certificate of the lab's CA and password
(scram-sha-256) logins. PostgreSQL refuses to run as root: run as root (the
lab is), the server runs as Debian's `postgres` user through `runuser`; run as
anyone else, as that user.

Two roles: ``admin`` (the cluster's superuser, for the tests' own queries over
the server's Unix socket) and ``pulumi``, which owns the database ``pulumi``
and nothing else: what an operator's CLI logs in as. The engine's PostgreSQL
backend (pkg/backend/diy/postgres, in v3.260.0) takes a libpq URL,
``postgres://user@host:port/database?sslmode=...``, and creates its table
(``pulumi_state``: key, JSON data) on first use; the password is not in the URL
but in PGPASSWORD, which libpq (and so the engine's driver) reads, so it is in
no `pulumi whoami` output and no credentials file.

``Postgres.behind(toxiproxy, ...)`` gives the URL of the same server through a
toxiproxy proxy with added latency (bench/toxiproxy.py), for the benchmark's
checkpoint-traffic runs.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lab import pki

if TYPE_CHECKING:
    from bench.toxiproxy import Toxiproxy

LOOPBACK = "127.0.0.1"
SERVICE_USER = "postgres"
"""Debian's postgresql package makes this user; the server runs as it when the lab runs as root."""
DATABASE = "pulumi"
ROLE = "pulumi"
ADMIN = "admin"


def bin_dir() -> Path:
    """The newest installed PostgreSQL's bin directory (/usr/lib/postgresql/<major>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise RuntimeError("no PostgreSQL server: run scripts/install.sh (it installs Debian's postgresql package)")
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def url(port: int, ca: Path, host: str = LOOPBACK, user: str = ROLE) -> str:
    """The backend URL of `pulumi login`: the certificate checked against the lab CA, no password in it."""
    return f"postgres://{user}@{host}:{port}/{DATABASE}?sslmode=verify-full&sslrootcert={ca}"


@dataclass
class Postgres:
    """One PostgreSQL cluster in a fresh directory; ``start()`` it, ``stop()`` removes it."""

    pki_dir: Path
    """The lab CA that issues the server's certificate (and that clients check it against)."""
    port: int = 0
    root: Path = field(default_factory=Path)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)

    @property
    def ca(self) -> Path:
        return self.pki_dir / pki.CA_CERT

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return url(self.port, self.ca)

    def client_env(self) -> dict[str, str]:
        """What an operator's shell adds for the CLI to log in: the password, for libpq to read."""
        return {"PGPASSWORD": self.password}

    def _as_server_user(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        command = ["runuser", "-u", SERVICE_USER, "--", *argv] if os.geteuid() == 0 else argv
        return subprocess.run(command, check=True, capture_output=True, text=True, cwd=self.root, **kw)  # type: ignore[call-overload, no-any-return]

    def start(self) -> Postgres:
        # Not under pytest's tmp_path: its parents are root's alone, and the server's user must reach the directory.
        self.root = Path(tempfile.mkdtemp(prefix="llmgw-postgres-"))
        self.port = self.port or free_port()
        owner = pwd.getpwnam(SERVICE_USER) if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
        cert, key = pki.issue_server_cert(self.pki_dir, self.root / "tls", "postgres", ips=[LOOPBACK], dns=["localhost"])
        pwfile = self.root / "admin-password"
        pwfile.write_text(self.admin_password + "\n")
        pwfile.chmod(0o600)
        for path in (self.root, self.root / "tls", cert, key, pwfile):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        self.root.chmod(0o700)
        bins = bin_dir()
        self._as_server_user([str(bins / "initdb"), "-D", str(self.data), "-U", ADMIN, f"--pwfile={pwfile}",
                              "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-instructions"])
        pwfile.unlink()
        options = " ".join([f"-c listen_addresses={LOOPBACK}", f"-p {self.port}", f"-c unix_socket_directories={self.root}",
                            "-c ssl=on", f"-c ssl_cert_file={cert}", f"-c ssl_key_file={key}", "-c fsync=off"])
        self._as_server_user([str(bins / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
                              "-o", options, "-w", "-t", "60", "start"])
        self.admin_sql(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{self.password}'")
        self.admin_sql(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        self.admin_sql(f"REVOKE ALL ON DATABASE {DATABASE} FROM PUBLIC")
        return self

    def admin_sql(self, sql: str, database: str = "postgres") -> list[list[str]]:
        """Run `sql` as the superuser over the server's socket; the rows, each a list of columns."""
        done = subprocess.run([str(bin_dir() / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", ADMIN,
                               "-d", database, "-v", "ON_ERROR_STOP=1", "-XAtF", "\t", "-c", sql],
                              env={**os.environ, "PGPASSWORD": self.admin_password}, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"psql: {done.stderr.strip()}")
        return [line.split("\t") for line in done.stdout.splitlines()]

    def keys(self, like: str) -> list[str]:
        """The backend's keys (its 'files', under the URL's path: 'pulumi/.pulumi/stacks/...') matching a LIKE pattern,
        e.g. '%/.pulumi/locks/%'; [] before its table exists."""
        exists = self.admin_sql("SELECT to_regclass('public.pulumi_state') IS NOT NULL", DATABASE)
        if exists != [["t"]]:
            return []
        return [row[0] for row in self.admin_sql(
            f"SELECT key FROM pulumi_state WHERE key LIKE '{like}' ORDER BY key", DATABASE)]

    def behind(self, toxiproxy: Toxiproxy, name: str = "postgres", round_trip_ms: int = 10) -> str:
        """The backend URL through a toxiproxy proxy that adds ``round_trip_ms`` to every round trip (half each way).
        The certificate still verifies: the proxy listens on loopback too and passes TLS through untouched."""
        if round_trip_ms % 2:
            raise ValueError(f"round trip of {round_trip_ms} ms: give an even number (half is added each way)")
        port = toxiproxy.proxy(name, LOOPBACK, self.port)
        toxiproxy.set_latency(name, round_trip_ms // 2)
        return url(port, self.ca)

    def stop(self) -> None:
        if self.data.is_dir():
            self._as_server_user([str(bin_dir() / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        if self.root != Path():
            shutil.rmtree(self.root, ignore_errors=True)
