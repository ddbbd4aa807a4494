"""The connection path of transport.py against in-process paramiko servers on loopback (tests/unit/ssh_server.py):
what a refusal says for each key type, a server that no longer offers the type recorded, waiting for a node that
refuses, remembering one that did not answer, and jump hosts, whose own keys are checked like a node's."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import paramiko
import pytest

from llmgw_pulumi import errors, transport
from llmgw_pulumi.specs import Connection
from tests.unit.ssh_server import Server, closed_port, connection, ed25519_pair, public_text


@pytest.fixture
def ecdsa_server() -> Iterator[Server]:
    client_key, client_text = ed25519_pair()
    yield from Server(paramiko.ECDSAKey.generate(), client_key, client_text).serve()


def fix_for(kind: str, fingerprint: str) -> str:
    return (f"do not accept the new key on trust: another machine may be answering at this address. Confirm it on the "
            f"machine itself, on its console and not over this network: `ssh-keygen -lf /etc/ssh/ssh_host_{kind}_key.pub` "
            f"must print {fingerprint}. If it does not, treat the machine as substituted. If it does, pin")


def test_a_changed_ecdsa_key_is_refused_naming_both_keys_and_the_file_to_check(ecdsa_server: Server) -> None:
    conn = connection(ecdsa_server)
    presented = public_text(ecdsa_server.host_key)
    recorded = public_text(paramiko.ECDSAKey.generate())
    with pytest.raises(errors.HostKeyChangedError) as refused:
        transport.establish(conn, conn, "gpu-01", recorded, time.monotonic() + 5)
    assert refused.value.message == (
        f"127.0.0.1 presented host key {transport.fingerprint(presented)}, but {transport.fingerprint(recorded)} was "
        "recorded when the node was onboarded; refusing to connect")
    assert refused.value.fix.startswith(fix_for("ecdsa", transport.fingerprint(presented)))
    assert str(refused.value).startswith("gpu-01: 127.0.0.1 presented host key SHA256:")
    assert ecdsa_server.logins == []


def test_a_pooled_connection_to_another_key_names_the_key_it_holds(ecdsa_server: Server) -> None:
    pool = transport.Pool()
    conn = connection(ecdsa_server)
    held = public_text(ecdsa_server.host_key)
    other = public_text(paramiko.ECDSAKey.generate())
    try:
        with pool.session(conn, "gpu-01", None):
            pass
        with pytest.raises(errors.HostKeyChangedError) as refused, pool.session(conn, "gpu-01", other):
            pytest.fail("a session was handed out")
        assert str(refused.value).startswith(
            f"gpu-01: 127.0.0.1 presented host key {transport.fingerprint(held)}, but {transport.fingerprint(other)} "
            "was expected; refusing to use it\n  fix: " + fix_for("ecdsa", transport.fingerprint(held)))
    finally:
        pool.close_all()


def test_a_server_that_no_longer_offers_the_recorded_key_type_is_refused(server: Server) -> None:
    conn = connection(server)  # the server holds an ed25519 key only
    recorded = public_text(paramiko.ECDSAKey.generate())
    with pytest.raises(errors.HostKeyChangedError) as refused:
        transport.establish(conn, conn, "gpu-01", recorded, time.monotonic() + 5)
    assert str(refused.value).startswith(
        "gpu-01: 127.0.0.1 no longer offers a ecdsa-sha2-nistp256 host key, the type that was pinned or recorded; "
        "refusing to connect\n  fix: " + fix_for("ed25519", "the fingerprint above"))
    assert server.logins == []


def test_a_node_that_refuses_is_waited_for_once_with_the_reason_then_given_up_on(caplog: pytest.LogCaptureFixture) -> None:
    port = closed_port()
    conn = Connection.from_props({"host": "127.0.0.1", "port": port, "user": "deploy", "wait": 2.0,
                                  "private_key": ed25519_pair()[1]}, "gpu-01")
    with caplog.at_level(logging.INFO, logger="llmgw_pulumi.transport"), \
            pytest.raises(transport.WaitExpired) as expired:
        transport.establish(conn, conn, "gpu-01", None, time.monotonic() + 2.0)  # three tries or more
    assert str(expired.value).startswith(
        "gpu-01: cannot reach deploy@127.0.0.1 over ssh after 2s (last error: [Errno 111] Connection refused)\n  fix: ")
    waits = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert waits == [f"gpu-01: waiting up to 2s for ssh to deploy@127.0.0.1:{port} ([Errno 111] Connection refused)"]


def test_a_login_refused_at_first_is_tried_again_and_the_wait_is_reported(server: Server,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    server.refuse_logins = 1  # the login user is not made yet on the first try
    conn = connection(server)
    with caplog.at_level(logging.INFO, logger="llmgw_pulumi.transport"):
        t, presented = transport.establish(conn, conn, "gpu-01", None, time.monotonic() + 5)
    t.close()
    assert presented == public_text(server.host_key) and server.logins == ["deploy", "deploy"]
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"gpu-01: waiting up to 5s for ssh to deploy@127.0.0.1:{server.port} "
                              "(deploy@127.0.0.1 refused every key tried: key llmgw:sshPrivateKey SHA256:")
    assert [m.rsplit(" ", 1)[0] for m in said[1:]] == [f"gpu-01: ssh to deploy@127.0.0.1:{server.port} answered after"]
    assert 0 <= float(said[1].rsplit(" ", 1)[1].removesuffix("s")) <= 5  # seconds since the first try


def test_a_node_that_did_not_answer_is_reported_unreachable_at_once_for_a_while() -> None:
    conn = Connection.from_props({"host": "127.0.0.1", "port": closed_port(), "user": "deploy", "wait": 0.0,
                                  "private_key": ed25519_pair()[1]}, "gpu-01")
    pool = transport.Pool(unreachable_memory=600)
    with pytest.raises(transport.WaitExpired) as first, pool.session(conn, "gpu-01"):
        pytest.fail("a session was handed out")
    with pytest.raises(errors.UnreachableError) as again, pool.session(conn, "gpu-01"):
        pytest.fail("a session was handed out")
    assert type(again.value) is errors.UnreachableError and str(again.value) == str(first.value)
    forgetful = transport.Pool(unreachable_memory=0)
    for _ in range(2):
        with pytest.raises(transport.WaitExpired), forgetful.session(conn, "gpu-01"):
            pytest.fail("a session was handed out")


@pytest.fixture
def bastion() -> Iterator[Server]:
    host_key, _ = ed25519_pair()
    client_key, client_text = ed25519_pair()
    yield from Server(host_key, client_key, client_text).serve()


def test_a_node_behind_a_jump_host_is_reached_through_it_and_both_keys_are_checked(server: Server,
                                                                                   bastion: Server) -> None:
    bastion.client_key = server.client_key  # one operator key for both
    hop = f"jumper@127.0.0.1:{bastion.port}"
    conn = Connection.from_props({"host": "127.0.0.1", "port": server.port, "user": "deploy", "wait": 5.0,
                                  "private_key": server.client_text, "jump": [{"address": hop}]}, "gpu-01")
    pool = transport.Pool()
    where = f"127.0.0.1:{bastion.port}"
    try:
        with pool.session(conn, "gpu-01") as s:
            assert s.host_key == public_text(server.host_key)
        assert bastion.logins == ["jumper"] and bastion.forwards == [("127.0.0.1", server.port)]
        assert server.logins == ["deploy"]
        with pool.session(conn, "gpu-01", public_text(server.host_key), {where: public_text(bastion.host_key)}):
            pass  # the same machines: both pooled connections are reused
        assert (bastion.logins, server.logins) == (["jumper"], ["deploy"])
        other = public_text(ed25519_pair()[0])
        with pytest.raises(errors.HostKeyChangedError) as refused, \
                pool.session(conn, "gpu-01", public_text(server.host_key), {where: other}):
            pytest.fail("a session was handed out")
        assert str(refused.value).startswith(
            f"gpu-01: 127.0.0.1 presented host key {transport.fingerprint(public_text(bastion.host_key))}, but "
            f"{transport.fingerprint(other)} was expected; refusing to use it")
    finally:
        pool.close_all()
    fresh = transport.Pool()  # a new deployment: the jump host's recorded key is expected when it connects
    try:
        with pytest.raises(errors.HostKeyChangedError, match="recorded when the node was onboarded"), \
                fresh.session(conn, "gpu-01", None, {where: other}):
            pytest.fail("a session was handed out")
        assert bastion.logins == ["jumper"] and server.logins == ["deploy"]
    finally:
        fresh.close_all()


def test_a_new_pooled_connection_expects_the_key_recorded(server: Server) -> None:
    pool = transport.Pool()
    other = public_text(ed25519_pair()[0])
    try:
        with pytest.raises(errors.HostKeyChangedError, match="recorded when the node was onboarded"), \
                pool.session(connection(server), "gpu-01", other):
            pytest.fail("a session was handed out")
        assert server.logins == [] and server.commands == []
        with pool.session(connection(server), "gpu-01", public_text(server.host_key)) as s:
            assert s.host_key == public_text(server.host_key)
    finally:
        pool.close_all()


# --------------------------------------------------------------------------- end of input


@pytest.mark.parametrize(("command", "rc"), [("true", 0), ("exit 3", 3), ("exec sh -c 'exit 4'", 4),
                                             ("printf out; printf err >&2; exit 5", 5)])
def test_a_command_reads_its_input_to_the_end_before_it_exits_keeping_its_exit_status(command: str, rc: int) -> None:
    """What sshd runs (in the login shell: /bin/sh here) cannot end before our end of input reached it, even when
    the command reads none of it or replaces its shell with `exec` (tests/e2e/test_openssh_channels.py shows why
    on OpenSSH); its output and exit status are the command's."""
    import subprocess

    from llmgw_pulumi.ssh_session import reads_its_input_to_the_end

    proc = subprocess.Popen(["/bin/sh", "-c", reads_its_input_to_the_end(command)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(b"payload the command did not read\n")
    proc.stdin.flush()
    time.sleep(0.3)
    assert proc.poll() is None  # still reading its input
    out, err = proc.communicate(timeout=10)  # closes its input: the end of input
    assert (proc.returncode, out, err) == (rc, b"out" if rc == 5 else b"", b"err" if rc == 5 else b"")
