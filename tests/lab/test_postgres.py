"""lab/postgres.py on its own: Debian's PostgreSQL started for the state backend, reached directly and through
toxiproxy with latency added (as the benchmark uses it); loopback only, no lab hosts."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.toxiproxy import Toxiproxy
from lab import pki
from lab.postgres import Postgres, bin_dir, free_port
from lab.stack import engine_bin, engine_env
from tests.conftest import REPO

QUERIES = 20


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    pki_dir = Path(tempfile.mkdtemp(prefix="llmgw-pg-ca-")) / "pki"
    pki.init_ca(pki_dir)
    started = Postgres(pki_dir).start()
    yield started
    started.stop()


def psql(url: str, server: Postgres, sql: list[str]) -> tuple[float, list[str]]:
    """Run each statement in one session as the backend's role; (seconds taken, each statement's one value)."""
    start = time.monotonic()
    done = subprocess.run([str(bin_dir() / "psql"), url.replace("postgres://", "postgresql://", 1), "-XAt",
                           *[arg for statement in sql for arg in ("-c", statement)]],
                          env={**os.environ, **server.client_env()}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - start, done.stdout.splitlines()


def test_the_backend_role_logs_in_over_verified_tls_with_its_password_only(server):
    _, out = psql(server.url, server, ["SELECT current_user", "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"])
    assert out == ["pulumi", "t"]
    wrong = subprocess.run([str(bin_dir() / "psql"), server.url.replace("postgres://", "postgresql://", 1), "-XAtc",
                            "SELECT 1"], env={**os.environ, "PGPASSWORD": "not-the-password"},
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr
    # The server runs as the postgres user, never as root, and its data directory is that user's alone.
    pid = int((server.data / "postmaster.pid").read_text().split()[0])
    owner = os.stat(server.data).st_uid
    assert os.stat(f"/proc/{pid}").st_uid == owner
    if os.geteuid() == 0:
        assert owner != 0
    assert os.stat(server.data).st_mode & 0o077 == 0


def test_toxiproxy_in_front_adds_its_latency_to_every_round_trip_and_the_engine_logs_in_through_it(server, tmp_path):
    binary = Path(subprocess.run([str(REPO / "scripts" / "bench-tools.sh")], check=True, capture_output=True,
                                 text=True).stdout.strip().splitlines()[-1]) / "toxiproxy-server"
    proxy = Toxiproxy(binary, tmp_path / "toxiproxy.log", port=free_port()).start()
    try:
        slow = server.behind(proxy, round_trip_ms=10)
        statements = [f"SELECT {i}" for i in range(QUERIES)]
        direct, out = psql(server.url, server, statements)
        assert out == [str(i) for i in range(QUERIES)]
        proxied, out = psql(slow, server, ["SELECT inet_server_port()", *statements[1:]])
        assert out == [str(server.port), *[str(i) for i in range(1, QUERIES)]]  # the same server, behind the proxy
        # A lower bound only: each statement is at least one round trip, each round trip at least 10 ms longer.
        print(f"{QUERIES} statements: {direct * 1000:.0f} ms direct, {proxied * 1000:.0f} ms through the proxy")
        assert proxied >= QUERIES * 0.010, (proxied, direct)
        env = engine_env(engine_bin(), tmp_path / "home", tmp_path / "unused")
        del env["PULUMI_BACKEND_URL"]
        env.update(server.client_env())
        login = subprocess.run(["pulumi", "login", slow, "--non-interactive"], env=env, capture_output=True, text=True,
                               timeout=120)
        assert login.returncode == 0, login.stdout + login.stderr
        listed = subprocess.run(["pulumi", "stack", "ls", "--all", "--non-interactive"], env=env, capture_output=True,
                                text=True, timeout=120, cwd=tmp_path)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert server.keys("%/.pulumi/meta.yaml"), "the engine did not write its backend metadata through the proxy"
    finally:
        proxy.stop()


