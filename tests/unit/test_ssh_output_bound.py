"""A node that prints without end: past connection.OUTPUT_LIMIT the command is stopped and a clean error names
the node; what is held in memory never passes the bound.

The channel is a stand-in for paramiko's (the session only opens channels, reads, feeds and closes them): it
emits chunks on stdout or stderr until it is closed, counting what it gave out.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from llmgw_pulumi.config.specs import Connection
from llmgw_pulumi.errors import RemoteCommandError
from llmgw_pulumi.nodestate.commands import Script
from llmgw_pulumi.ssh import connection

CHUNK = 1 << 16
PACKAGE_LIMIT = connection.OUTPUT_LIMIT
"""As the package has it, before the tests below make it smaller."""


class FloodingChannel:
    """A channel whose command prints ``stdout`` bytes then ``stdout_forever`` (and the same for stderr), exits 0."""

    def __init__(self, stdout: int = 0, stderr: int = 0, forever: str = "") -> None:
        self.left = {"stdout": stdout, "stderr": stderr}
        self.forever = forever
        self.given = {"stdout": 0, "stderr": 0}
        self.closed = threading.Event()
        self.stuck = False

    def _recv(self, stream: str, n: int) -> bytes:
        if self.closed.is_set():
            return b""
        if stream == self.forever:
            size = n
        else:
            size = min(n, self.left[stream])
            self.left[stream] -= size
            if size == 0 and stream == "stdout" and self.forever == "stderr":
                # stdout stays open while stderr floods (a command blocked on a full stderr window), until the
                # session stops the command; ``stuck`` if it never does.
                self.stuck = not self.closed.wait(5)
                return b""
        self.given[stream] += size
        return b"x" * size

    def recv(self, n: int) -> bytes:
        return self._recv("stdout", n)

    def recv_stderr(self, n: int) -> bytes:
        return self._recv("stderr", n)

    def settimeout(self, _: float) -> None:
        pass

    def exec_command(self, _: str) -> None:
        pass

    def sendall(self, _: bytes) -> None:
        pass

    def shutdown_write(self) -> None:
        pass

    def recv_exit_status(self) -> int:
        return -1 if self.closed.is_set() else 0

    def close(self) -> None:
        self.closed.set()


class Transport:
    def __init__(self, channel: FloodingChannel) -> None:
        self.channel = channel

    def open_session(self, timeout: float) -> FloodingChannel:
        return self.channel

    def is_active(self) -> bool:
        return True


def run(channel: FloodingChannel) -> Any:
    conn = Connection(host="10.0.0.11", user="root")
    session = connection.Session(Transport(channel), conn, "gpu-01", "ssh-ed25519 AAAA", {})  # type: ignore[arg-type]
    return session.run(Script("cat /dev/zero"))


@pytest.fixture(autouse=True)
def small_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    limit = 1 << 20  # 16 MiB as the package has it, 1 MiB here: the same code, a quicker test
    monkeypatch.setattr(connection, "OUTPUT_LIMIT", limit)
    return limit


def test_the_package_bound_is_16_mib() -> None:
    assert PACKAGE_LIMIT == 16 * 1024 * 1024


def test_output_up_to_the_bound_is_read_whole(small_limit: int) -> None:
    """The positive control: as much as the bound, on each stream, is kept."""
    res = run(FloodingChannel(stdout=small_limit, stderr=small_limit))
    assert (res.rc, len(res.stdout), len(res.stderr)) == (0, small_limit, small_limit)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_past_the_bound_is_a_clean_error_naming_the_node(small_limit: int, stream: str) -> None:
    channel = FloodingChannel(forever=stream)
    with pytest.raises(RemoteCommandError) as err:
        run(channel)
    assert err.value.node == "gpu-01" and stream in err.value.message and "MiB" in err.value.message
    assert err.value.fix
    assert channel.closed.is_set() and not channel.stuck  # the command was stopped, not waited for
    assert channel.given[stream] <= small_limit + CHUNK  # nothing more was read than one chunk past the bound


def test_each_script_run_is_a_debug_line_with_its_name_and_seconds(small_limit: int,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """What the benchmark's breakdown reads from the event log (bench/measure.py, SCRIPT_TIME)."""
    from bench.measure import SCRIPT_TIME

    conn = Connection(host="10.0.0.11", user="root")
    session = connection.Session(Transport(FloodingChannel(stdout=10, stderr=0)), conn, "gpu-01",  # type: ignore[arg-type]
                                 "ssh-ed25519 AAAA", {})
    with caplog.at_level(logging.DEBUG, logger="llmgw_pulumi.ssh.connection"):
        session.run(Script("true", name="survey.sh"))
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(lines) == 1 and lines[0].startswith("gpu-01: survey.sh took ") and lines[0].endswith(
        "s on 10.0.0.11 (exit 0)"), lines
    took = SCRIPT_TIME.search(lines[0])
    assert took is not None and took["script"] == "survey.sh" and 0 <= float(took["seconds"]) < 5
