"""The connection path of transport.py against in-process paramiko servers on loopback (tests/unit/ssh_server.py):
what a refusal says for each key type, a server that no longer offers the type recorded, waiting for a node that
refuses, remembering one that did not answer, and jump hosts, whose own keys are checked like a node's; RSA host keys
verified with whichever of its signature algorithms the server offers, the reconnection after cloud-init was waited
for (and the key the node keeps then), the pool's reaper, and a pooled connection that died."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

import paramiko
import pytest

from llmgw_pulumi import errors
from llmgw_pulumi.config.specs import Connection
from llmgw_pulumi.ssh import transport
from tests.unit.error_checks import assert_refused
from tests.unit.ssh_server import Server, closed_port, connection, ed25519_pair, public_text


@pytest.fixture
def ecdsa_server() -> Iterator[Server]:
    client_key, client_text = ed25519_pair()
    yield from Server(paramiko.ECDSAKey.generate(), client_key, client_text).serve()


def assert_says_what_to_check_on_the_machine(refusal: errors.HostKeyChangedError, kind: str, fingerprint: str) -> None:
    """A changed host key of gpu-01 refused with a fix that names the key file to check on the machine itself and
    the fingerprint it must print there (the rest of the fix is errors.py's)."""
    assert_refused(refusal, errors.HostKeyChangedError, "gpu-01")
    assert f"`ssh-keygen -lf /etc/ssh/ssh_host_{kind}_key.pub` must print {fingerprint}." in refusal.fix, refusal.fix


def test_a_changed_ecdsa_key_is_refused_naming_both_keys_and_the_file_to_check(ecdsa_server: Server) -> None:
    conn = connection(ecdsa_server)
    presented = public_text(ecdsa_server.host_key)
    recorded = public_text(paramiko.ECDSAKey.generate())
    with pytest.raises(errors.HostKeyChangedError) as refused:
        transport.establish(conn, conn, "gpu-01", recorded, time.monotonic() + 5)
    assert refused.value.message == (
        f"127.0.0.1 presented host key {transport.fingerprint(presented)}, but {transport.fingerprint(recorded)} was "
        "recorded when the node was onboarded; refusing to connect")
    assert_says_what_to_check_on_the_machine(refused.value, "ecdsa", transport.fingerprint(presented))
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
        assert refused.value.message == (
            f"127.0.0.1 presented host key {transport.fingerprint(held)}, but {transport.fingerprint(other)} "
            "was expected; refusing to use it")
        assert_says_what_to_check_on_the_machine(refused.value, "ecdsa", transport.fingerprint(held))
    finally:
        pool.close_all()


def test_a_server_that_no_longer_offers_the_recorded_key_type_is_refused(server: Server) -> None:
    conn = connection(server)  # the server holds an ed25519 key only
    recorded = public_text(paramiko.ECDSAKey.generate())
    with pytest.raises(errors.HostKeyChangedError) as refused:
        transport.establish(conn, conn, "gpu-01", recorded, time.monotonic() + 5)
    assert refused.value.message == (
        "127.0.0.1 no longer offers a ecdsa-sha2-nistp256 host key, the type that was pinned or recorded; "
        "refusing to connect")
    assert_says_what_to_check_on_the_machine(refused.value, "ed25519", "the fingerprint above")
    assert server.logins == []


def test_a_node_that_refuses_is_waited_for_once_with_the_reason_then_given_up_on(caplog: pytest.LogCaptureFixture) -> None:
    port = closed_port()
    conn = Connection.from_props({"host": "127.0.0.1", "port": port, "user": "deploy", "wait": 2.0,
                                  "private_key": ed25519_pair()[1]}, "gpu-01")
    with caplog.at_level(logging.INFO, logger="llmgw_pulumi.ssh.transport"), \
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
    with caplog.at_level(logging.DEBUG, logger="llmgw_pulumi.ssh.transport"):
        t, presented = transport.establish(conn, conn, "gpu-01", None, time.monotonic() + 5)
    t.close()
    assert presented == public_text(server.host_key) and server.logins == ["deploy", "deploy"]
    said = [r.getMessage() for r in caplog.records]
    # The wait: info, ephemeral (in the node's row, not again under Diagnostics); when it answered: debug.
    assert [(r.levelno, getattr(r, "ephemeral", False)) for r in caplog.records] == [(logging.INFO, True),
                                                                                   (logging.DEBUG, False)]
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

    from llmgw_pulumi.ssh.connection import reads_its_input_to_the_end

    proc = subprocess.Popen(["/bin/sh", "-c", reads_its_input_to_the_end(command)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(b"payload the command did not read\n")
    proc.stdin.flush()
    time.sleep(0.3)
    assert proc.poll() is None  # still reading its input
    out, err = proc.communicate(timeout=10)  # closes its input: the end of input
    assert (proc.returncode, out, err) == (rc, b"out" if rc == 5 else b"", b"err" if rc == 5 else b"")


# --------------------------------------------------------------------------- RSA host keys


RSA_HOST_KEY = paramiko.RSAKey.generate(2048)  # once: a mutation run forks every test from this process


def eventually(condition: Callable[[], bool], within: float = 10.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``within`` seconds passed (False)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()



@pytest.fixture(params=[(), ("rsa-sha2-512",), ("rsa-sha2-256",)], ids=["both", "rsa-sha2-256 only", "rsa-sha2-512 only"])
def rsa_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    client_key, client_text = ed25519_pair()
    yield from Server(RSA_HOST_KEY, client_key, client_text, refused_key_types=request.param).serve()


def test_a_recorded_rsa_host_key_is_verified_with_any_signature_algorithm_the_server_offers(rsa_server: Server) -> None:
    """A node whose host key is RSA (recorded or pinned): with SHA-2 signatures, either one (before, the type was
    given to paramiko as 'ssh-rsa' too, SHA-1, which paramiko 5 refuses with a ValueError before connecting)."""
    conn = connection(rsa_server)
    recorded = public_text(RSA_HOST_KEY)
    t, presented = transport.establish(conn, conn, "gpu-01", recorded, time.monotonic() + 5)
    t.close()
    assert presented == recorded and rsa_server.logins == ["deploy"]


# --------------------------------------------------------------------------- after cloud-init


def cloud_init_replaces_the_host_key(new_key: paramiko.PKey) -> Callable[[Server, str], bytes | None]:
    """The node's cloud-init was running: it is waited for, then has new host keys and a restarted sshd whose
    first login is refused (the user is made again)."""
    def printed(srv: Server, command: str) -> bytes | None:
        if "cloud-init status" not in command:
            return b""
        srv.host_key, srv.refuse_logins = new_key, 1
        return b"waited\n"
    return printed


def test_after_waiting_for_cloud_init_the_node_is_reconnected_and_the_key_it_keeps_is_recorded(
        server: Server, caplog: pytest.LogCaptureFixture) -> None:
    first_key = server.host_key
    kept, _ = ed25519_pair()
    server.printed = cloud_init_replaces_the_host_key(kept)
    pool = transport.Pool()
    try:
        with caplog.at_level(logging.DEBUG, logger="llmgw_pulumi.ssh.transport"), \
                pool.session(connection(server), "gpu-01") as s:
            assert s.host_key == public_text(kept) != public_text(first_key)
        said = [r.getMessage() for r in caplog.records if r.name == "llmgw_pulumi.ssh.transport"]
        assert said[0].startswith(f"gpu-01: waiting up to 5s for ssh to deploy@127.0.0.1:{server.port} "
                                  "(deploy@127.0.0.1 refused every key tried")  # the reconnection, retried once
        assert said[1].startswith(f"gpu-01: ssh to deploy@127.0.0.1:{server.port} answered after") and len(said) == 2
        assert [c for c in server.commands if "cloud-init" in c] == [server.commands[0]] and len(server.commands) == 1
        assert server.logins == ["deploy", "deploy", "deploy"]  # before, refused once after the restart, accepted
        assert len(server.connections) == 3
        assert eventually(lambda: not server.connections[0].is_active())  # the connection before the wait is closed
        assert server.connections[2].is_active()  # the one handed out stays pooled
    finally:
        pool.close_all()


def test_the_key_recorded_is_expected_after_cloud_init_too(server: Server) -> None:
    recorded = public_text(server.host_key)
    server.printed = cloud_init_replaces_the_host_key(ed25519_pair()[0])
    pool = transport.Pool()
    try:
        with pytest.raises(errors.HostKeyChangedError, match="recorded when the node was onboarded"), \
                pool.session(connection(server), "gpu-01", recorded):
            pytest.fail("a session was handed out")
        assert server.logins == ["deploy"]  # only before the wait: the new key was refused before logging in
    finally:
        pool.close_all()


def test_a_node_behind_a_jump_host_is_reconnected_through_it_after_cloud_init(server: Server) -> None:
    host_key, _ = ed25519_pair()
    bastion = Server(host_key, server.client_key, server.client_text)
    serving = bastion.serve()
    next(serving)
    try:
        kept, _ = ed25519_pair()
        server.printed = cloud_init_replaces_the_host_key(kept)
        conn = Connection.from_props({"host": "127.0.0.1", "port": server.port, "user": "deploy", "wait": 5.0,
                                      "private_key": server.client_text,
                                      "jump": [{"address": f"jumper@127.0.0.1:{bastion.port}"}]}, "gpu-01")
        pool = transport.Pool()
        try:
            with pool.session(conn, "gpu-01") as s:
                assert s.host_key == public_text(kept)
            assert bastion.forwards == [("127.0.0.1", server.port)] * 3 and bastion.logins == ["jumper"]
        finally:
            pool.close_all()
    finally:
        serving.close()


def test_cloud_init_that_does_not_finish_within_the_wait_is_an_expired_wait_naming_the_node(server: Server) -> None:
    server.printed = lambda srv, command: None if "cloud-init status" in command else b""
    conn = Connection.from_props({"host": "127.0.0.1", "port": server.port, "user": "deploy", "wait": 1.0,
                                  "private_key": server.client_text}, "gpu-01")
    assert expired_wait(conn).startswith(
        "gpu-01: cloud-init on 127.0.0.1 did not report done within 1s (cloud-init status --wait)\n  fix: ")


# --------------------------------------------------------------------------- the pool


def reapers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "llmgw-ssh-reaper"]


@contextlib.contextmanager
def pool_of(idle_seconds: float = transport.IDLE_SECONDS) -> Iterator[transport.Pool]:
    """A pool whose connections are closed after ``idle_seconds`` unused; every one closed at the end."""
    pool = transport.Pool(idle_seconds=idle_seconds)
    try:
        yield pool
    finally:
        pool.close_all()


def expired_wait(conn: Connection) -> str:
    """The message of the WaitExpired that asking a fresh pool for a session to ``conn`` raises."""
    with pool_of() as pool, pytest.raises(transport.WaitExpired) as expired, pool.session(conn, "gpu-01"):
        pytest.fail("a session was handed out")
    return str(expired.value)


def test_an_idle_connection_is_closed_by_the_pools_one_reaper_a_daemon_thread(server: Server) -> None:
    before = set(reapers())
    with pool_of(0.2) as pool:
        with pool.session(connection(server), "gpu-01"):
            pass
        assert eventually(lambda: not server.connections[0].is_active())
        with pool.session(connection(server), "gpu-01") as s:  # a fresh connection after the idle one was closed
            assert s.host_key == public_text(server.host_key)
        assert len(server.connections) == 2 and server.logins == ["deploy", "deploy"]
        new = [t for t in reapers() if t not in before]
        assert [(t.daemon, t.is_alive()) for t in new] == [(True, True)]  # one; it never keeps the process alive


def test_a_connection_in_use_is_not_closed_however_long_it_is_used(server: Server) -> None:
    with pool_of(0.05) as pool:
        with pool.session(connection(server), "gpu-01"):
            time.sleep(0.5)  # ten idle limits, forty reaper rounds
            assert server.connections[0].is_active()
        assert eventually(lambda: not server.connections[0].is_active())  # the control: idle now, it is closed


def test_a_connection_two_resources_use_is_not_closed_while_one_of_them_still_does(server: Server) -> None:
    with pool_of(0.05) as pool, pool.session(connection(server), "gpu-01"):
        with pool.session(connection(server), "gpu-01"):
            pass  # the other resource is done with it
        time.sleep(0.5)
        assert server.connections[0].is_active() and server.logins == ["deploy"]


def test_a_long_wait_backs_off_to_the_last_delay_and_keeps_it() -> None:
    """Five refusals and more (0.25 + 0.5 + 1 + 2 s, then 2 s each) end in the expired wait, nothing else."""
    conn = Connection.from_props({"host": "127.0.0.1", "port": closed_port(), "user": "deploy", "wait": 6.0,
                                  "private_key": ed25519_pair()[1]}, "gpu-01")
    with pytest.raises(transport.WaitExpired, match="cannot reach deploy@127.0.0.1 over ssh after 6s"):
        transport.establish(conn, conn, "gpu-01", None, time.monotonic() + 6.0)


def test_a_pooled_connection_that_died_is_replaced(server: Server) -> None:
    pool = transport.Pool()
    try:
        with pool.session(connection(server), "gpu-01") as s:
            pass
        server.connections[0].close()  # sshd restarted, the node rebooted
        assert eventually(lambda: not s._transport.is_active())  # the client's end has seen it
        with pool.session(connection(server), "gpu-01", public_text(server.host_key)) as again:
            assert again is not s and again.host_key == public_text(server.host_key)
        assert server.logins == ["deploy", "deploy"]
    finally:
        pool.close_all()


def test_a_jump_host_that_does_not_open_the_channel_to_the_node_is_waited_for_as_long_as_the_node(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    host_key, _ = ed25519_pair()
    held = threading.Event()
    bastion = Server(host_key, server.client_key, server.client_text, forwards_held=held)
    serving = bastion.serve()
    next(serving)
    monkeypatch.setattr(transport, "CONNECT_TIMEOUT", 0.2)  # each try of the channel; the wait bounds them all
    conn = Connection.from_props({"host": "127.0.0.1", "port": server.port, "user": "deploy", "wait": 1.0,
                                  "private_key": server.client_text,
                                  "jump": [{"address": f"jumper@127.0.0.1:{bastion.port}"}]}, "gpu-01")
    try:
        assert expired_wait(conn).startswith(
            "gpu-01: cannot reach deploy@127.0.0.1 over ssh after 1s (last error: Timeout opening channel.)")
        assert bastion.forwards and server.logins == []  # asked for, never carried
    finally:
        held.set()
        serving.close()
