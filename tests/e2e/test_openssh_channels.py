"""The transport against a node's real OpenSSH: a pooled connection outlives commands that exit without reading
their input, however late our end of input is sent.

paramiko builds a channel's end-of-input message under the channel's lock and sends it after releasing the lock.
When the thread that does it is preempted in that gap (it happened once in a 1,000-node benchmark, at load 56 on
2 CPUs), a command that exits without reading its input lets sshd close the channel first; the end of input then
names a channel sshd has freed, and sshd drops the whole connection ("ieof packet referred to nonexistent
channel 0" in the node's journal), so the node's next step over the pooled connection failed with "Unable to open
channel". `late_end_of_input` makes that gap as wide as the test needs: the message is sent once the channel has
closed, or after LATE_SECONDS. `connection.reads_its_input_to_the_end` is what keeps the connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import paramiko
import pytest

from llmgw_pulumi.config.specs import Connection
from llmgw_pulumi.errors import RemoteCommandError
from llmgw_pulumi.nodestate.commands import Script
from llmgw_pulumi.ssh import connection, transport
from tests.conftest import ssh

pytestmark = [pytest.mark.hosts]

LATE_SECONDS = 2.0
"""How long the end of input waits for the channel to close before it is sent anyway."""


@pytest.fixture
def late_end_of_input(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """paramiko's `Channel.shutdown_write` as it runs when its thread is preempted between building the message
    and sending it (paramiko 5.1's `Channel.shutdown`, with a wait in the gap). Yields, per end of input, whether
    the channel had closed before it was sent."""
    after_close: list[bool] = []

    def late(chan: paramiko.Channel) -> None:
        with chan.lock:
            message = chan._send_eof()  # type: ignore[attr-defined]  # what paramiko builds under the lock
        end = time.monotonic() + LATE_SECONDS
        while not chan.closed and time.monotonic() < end:
            time.sleep(0.01)
        if message is not None:
            after_close.append(chan.closed)
            assert chan.transport is not None
            chan.transport._send_user_message(message)  # type: ignore[attr-defined]  # sent after releasing it

    monkeypatch.setattr(paramiko.Channel, "shutdown_write", late)
    yield after_close


def commands_over_one_connection(host: Any, cluster: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], int]:
    """Three commands that exit without reading their input (the transport's cloud-init check, then `true` and a
    printf, each under sudo), over one pooled connection: what the last two printed, and how many connections the
    pool opened."""
    conn = Connection.from_props({"host": host.addr, "user": "deploy", "wait": 30.0,
                                  "private_key_path": str(cluster.ssh_key_path)}, host.hostname)
    opened: list[str] = []
    establish = transport.establish

    def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(host.addr)
        return establish(*args, **kwargs)

    monkeypatch.setattr(transport, "establish", counted)
    pool = transport.Pool()
    try:
        with pool.session(conn, host.hostname) as session:
            printed = [session.run(Script("true")).stdout,
                       session.run(Script('printf "%s" "$1"', ("still connected",))).stdout]
    finally:
        pool.close_all()
    return printed, len(opened)


def test_a_pooled_connection_outlives_commands_that_exit_before_our_end_of_input(
        cluster: Any, hosts: Any, late_end_of_input: list[bool], monkeypatch: pytest.MonkeyPatch) -> None:
    host, = hosts(1)
    printed, opened = commands_over_one_connection(host, cluster, monkeypatch)
    assert printed == ["", "still connected"]
    assert opened == 1
    # Each end of input reached sshd while the command still read it: none waited for a closed channel.
    assert late_end_of_input == [False] * 3
    rc, journal = ssh(host, cluster, "sudo journalctl -t sshd --no-pager -o cat")
    assert rc == 0 and "Accepted publickey for deploy" in journal  # the journal is read (positive control)
    assert "nonexistent channel" not in journal


def test_without_reading_to_the_end_a_late_end_of_input_drops_the_connection(
        cluster: Any, hosts: Any, late_end_of_input: list[bool], monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault the first test survives, shown to strike: without `reads_its_input_to_the_end`, sshd closes the
    channel before our end of input, and drops the connection when it comes."""
    host, = hosts(1)
    monkeypatch.setattr(connection, "reads_its_input_to_the_end", lambda command: command)
    with pytest.raises(RemoteCommandError) as broke:
        commands_over_one_connection(host, cluster, monkeypatch)
    assert "the SSH connection to deploy@" in broke.value.message and "broke" in broke.value.message
    assert late_end_of_input[0] is True  # the cloud-init check ended, and its channel closed, before its end of input
    rc, journal = ssh(host, cluster, "sudo journalctl -t sshd --no-pager -o cat")
    assert rc == 0 and "nonexistent channel" in journal
