"""Host keys checked in a real SSH handshake: an in-process paramiko server on loopback.

transport.py compares the key a server presents with the one pinned or
recorded in two places: when a connection is made (``establish``) and when a
pooled connection is handed to another resource (``Pool._checkout``). Both are
exercised here against a server whose host key the test chooses; the server
records each login and command, so a refusal is seen to come before either.
"""

from __future__ import annotations

import time

import paramiko
import pytest

from llmgw_pulumi import errors
from llmgw_pulumi.ssh import transport
from tests.unit.ssh_server import Server, connection, ed25519_pair, public_text


def test_establish_refuses_a_key_other_than_the_one_recorded_before_logging_in(server: Server) -> None:
    conn = connection(server)
    other = public_text(ed25519_pair()[0])
    with pytest.raises(errors.HostKeyChangedError) as refused:
        transport.establish(conn, conn, "gpu-01", other, time.monotonic() + 5)
    assert "recorded when the node was onboarded" in refused.value.message
    assert transport.fingerprint(public_text(server.host_key)) in refused.value.message
    assert transport.fingerprint(public_text(server.host_key)) in refused.value.fix  # the key to confirm
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in refused.value.fix
    assert server.logins == [] and server.commands == []
    # Positive control: the recorded key is accepted, and the login follows.
    t, presented = transport.establish(conn, conn, "gpu-01", public_text(server.host_key), time.monotonic() + 5)
    t.close()
    assert presented == public_text(server.host_key) and server.logins == ["deploy"]


def test_establish_refuses_a_key_other_than_the_pinned_one(server: Server) -> None:
    conn = connection(server, pin=public_text(ed25519_pair()[0]))
    with pytest.raises(errors.HostKeyChangedError, match="was pinned"):
        transport.establish(conn, conn, "gpu-01", None, time.monotonic() + 5)
    assert server.logins == []


def test_a_pooled_connection_is_not_handed_to_a_resource_expecting_another_machine(server: Server) -> None:
    pool = transport.Pool()
    conn = connection(server)
    try:
        with pool.session(conn, "gpu-01", None) as s:  # first use: trusted and recorded
            assert s.host_key == public_text(server.host_key)
        opened = list(server.logins)
        with pool.session(conn, "gpu-01", public_text(server.host_key)):
            pass  # the same machine: the pooled connection is reused
        assert server.logins == opened
        other = public_text(ed25519_pair()[0])
        commands = len(server.commands)
        with (pytest.raises(errors.HostKeyChangedError, match="was expected; refusing to use it") as refused,
              pool.session(conn, "gpu-01", other)):
            pytest.fail("a session was handed out")
        assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in refused.value.fix
        assert len(server.commands) == commands
        # A pin wins over what the resource recorded, on a pooled connection too.
        with (pytest.raises(errors.HostKeyChangedError),
              pool.session(connection(server, pin=other), "gpu-01", public_text(server.host_key))):
            pytest.fail("a session was handed out")
    finally:
        pool.close_all()


def test_an_open_connection_waits_poll_seconds_between_looks_not_paramikos_tenth(server: Server) -> None:
    conn = connection(server)
    t, _ = transport.establish(conn, conn, "gpu-01", None, time.monotonic() + 5)
    try:
        assert transport.POLL_SECONDS == 1.0
        assert t.sock.gettimeout() == transport.POLL_SECONDS
        assert paramiko.Transport._active_check_timeout == 0.1  # the control: what paramiko itself would have set
        # Still answering at once: the node's reply wakes the thread, not the next look.
        started = time.monotonic()
        channel = t.open_session(timeout=5)
        channel.close()
        assert time.monotonic() - started < transport.POLL_SECONDS / 2
    finally:
        t.close()
