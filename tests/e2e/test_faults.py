"""Faults under the real engine on real hosts: each run ends with the node as declared or unchanged.

Every test injects one fault into a real `pulumi up` (a dying SSH session, a
broken release server, a full disk, an agent that will not start, a reboot,
an interrupted CLI, a bad CA), checks what the operator was told and what the
node looks like right after, and then shows that running `pulumi up` again
(after fixing the cause, where there is one) converges: `pulumi refresh`
reads the node back and `pulumi preview` has nothing to do.

Faults that must strike in the middle of an install use a second release
server with `--delay`, which holds every download for a few seconds: the
install is caught while the node's curl waits (a staging dir exists and a curl
process runs in the host's cgroup).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lab.doubles.llmgw import build_llmgw
from lab.release_server import publish_release, serving
from tests.conftest import NEXT_RELEASE, RELEASE, ssh, stack_config, wait_until
from tests.e2e.node_checks import BINARY, CONFIG, UNIT, leftovers, report

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

AGENT_CERT = "/etc/llmgw/agent.pem"
SLOW_DELAY = 3.0
"""Seconds the slow release server holds each response: an install then spends ~2x this downloading."""
BROKEN_START = "v2.0.0"
"""A release whose agent exits 1 at once (published by the test that needs it)."""
FATAL_LINE = "llmgw: fatal: simulated fault: cannot open the stream socket"

# Ports of the extra release servers, next to the cluster's (8443) in the same netns.
PORT_SLOW, PORT_STALLED, PORT_CORRUPT, PORT_DOWN = 8444, 8445, 8446, 8449


# --------------------------------------------------------------------------- node inspection


def host_processes(host: Any) -> list[tuple[int, str]]:
    """(pid, cmdline) of every process of a running host, seen from outside through its cgroup."""
    top = host.cgroups[0]
    out: list[tuple[int, str]] = []
    for d, _, _ in os.walk(top):
        try:
            pids = [int(p) for p in (Path(d) / "cgroup.procs").read_text().split()]
        except OSError:
            continue
        for pid in pids:
            try:
                cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            out.append((pid, cmd.strip()))
    return out


def downloading(host: Any) -> bool:
    """An agent install is in flight and waiting for the release server: its curl writes into the staging dir."""
    return host.running and any(cmd.startswith("curl ") and "llmgw-stage." in cmd for _, cmd in host_processes(host))


def install_running(host: Any) -> bool:
    """A script of this package is still running on the host (e.g. one whose SSH session died)."""
    return any("llmgw-stage" in cmd or "llmgw-new" in cmd for _, cmd in host_processes(host))


def kill_sshd_sessions(host: Any, user: str = "deploy") -> list[str]:
    """SIGKILL the server side of every SSH session of `user` on the host (its sshd processes)."""
    killed = []
    for pid, cmd in host_processes(host):
        if cmd.startswith(f"sshd: {user}"):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(cmd)
            except ProcessLookupError:
                pass
    return killed


def agent_facts(host: Any, cluster: Any) -> dict[str, str]:
    """What matters about the agent, read over SSH: is it running, which process, which files."""
    rc, out = ssh(host, cluster, "systemctl is-active llmgw-agent; systemctl show -p MainPID --value llmgw-agent; "
                                 f"sudo sha256sum {BINARY} {CONFIG} {UNIT} 2>&1; true")
    lines = out.splitlines()
    facts = {"active": lines[0].strip(), "pid": lines[1].strip()}
    for line in lines[2:]:
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            facts[parts[1]] = parts[0]
        else:
            facts.setdefault("missing", "")
            facts["missing"] += line + "\n"
    return facts


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key_line(output: str, *needles: str) -> str:
    """The first line of CLI output holding the first needle found (for the report of what the operator saw)."""
    for needle in needles:
        for line in output.splitlines():
            if needle in line:
                return line.strip()
    return "(not found)"


def kinds(urns: list[str]) -> list[str]:
    """The resource types in a list of URNs, e.g. ['Stack', 'Node', 'ClientCertificate']."""
    return [u.split("::")[2].rsplit("$", 1)[-1].rsplit(":", 1)[-1] for u in urns]


def state_summary(stack: Any) -> dict[str, Any]:
    deployment = stack.export()
    urns = [r["urn"] for r in deployment.get("resources", [])]
    return {"urns": urns, "pending": deployment.get("pending_operations") or []}


def assert_state_clean(stack: Any, resources: int = 6) -> None:
    s = state_summary(stack)
    assert len(s["urns"]) == len(set(s["urns"])), f"a resource is listed twice: {s['urns']}"
    custom = [u for u in s["urns"] if "pulumi:providers:" not in u]
    assert len(custom) == resources, s["urns"]
    assert s["pending"] == [], s["pending"]


def converges(stack: Any) -> dict[str, float]:
    """`pulumi up` succeeds, `pulumi refresh` reads the node back, and then nothing is left to do."""
    up = stack.up()
    assert up.ok, up.output
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output
    return {"rerun_up": up.seconds}


def assert_agent_as(host: Any, cluster: Any, binary: bytes) -> None:
    facts = agent_facts(host, cluster)
    assert facts["active"] == "active", facts
    assert facts.get(BINARY) == sha(binary), facts
    assert cluster.control_plane.wait_for({host.hostname}, timeout=20), cluster.control_plane.events[-5:]


# --------------------------------------------------------------------------- release servers


@pytest.fixture(scope="module")
def release_tls(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """(address, cert, key) for extra release servers in the cluster release server's netns."""
    from lab import pki as labpki

    addr = cluster.release_url.split("//")[1].rsplit(":", 1)[0]
    cert, key = labpki.issue_server_cert(cluster.pki_dir, tmp_path_factory.mktemp("release-tls"), "releases-x",
                                         ips=[addr], dns=[])
    return addr, str(cert), str(key)


@contextmanager
def release_server(lab: Any, tls: tuple[str, str, str], root: Path, port: int, delay: float = 0.0,
                   log: Path | None = None) -> Iterator[str]:
    """Another release server (HTTPS, trusted by onboarded nodes) serving `root`; yields its URL."""
    addr, cert, key = tls
    with open(log, "wb") if log else nullcontext(subprocess.DEVNULL) as stderr, \
            serving(lab, root, addr, port, cert, key, delay=delay, log=stderr) as url:
        yield url


@pytest.fixture
def slow_release(lab: Any, cluster: Any, release_tls: Any, tmp_path: Path) -> Iterator[str]:
    with release_server(lab, release_tls, cluster.release_root, PORT_SLOW, delay=SLOW_DELAY,
                        log=tmp_path / "slow-release.log") as url:
        yield url


class Injector(threading.Thread):
    """Waits (in a thread) for `when()`, then runs `then()`; the test's own thread drives `pulumi up`."""

    def __init__(self, when: Callable[[], bool], then: Callable[[], Any], timeout: float = 120) -> None:
        super().__init__(daemon=True)
        self.when, self.then, self.timeout = when, then, timeout
        self.result: Any = None
        self.error: BaseException | None = None
        self.at: float | None = None

    def run(self) -> None:
        try:
            if wait_until(self.when, self.timeout, interval=0.05):
                self.at = time.monotonic()
                self.result = self.then()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def done(self) -> Any:
        self.join(timeout=self.timeout + 60)
        assert self.error is None, repr(self.error)
        assert self.at is not None, "the fault was never injected: the moment it waits for did not come"
        return self.result


# --------------------------------------------------------------------------- 1. SSH dies mid-install


def test_ssh_session_killed_in_the_middle_of_an_install(lab, cluster, hosts, new_stack, slow_release):
    t0 = time.monotonic()
    (h,) = hosts(1)
    stack = new_stack(stack_config(cluster, [h], agent={"version": RELEASE, "releaseUrl": slow_release,
                                                        "signingKey": cluster.release_signing_key}))

    injector = Injector(lambda: downloading(h), lambda: kill_sshd_sessions(h))
    injector.start()
    up = stack.up()
    killed = injector.done()
    assert killed, "no sshd session of deploy was found to kill"
    assert not up.ok
    line = key_line(up.output, "RemoteCommandError", "broke", "error:")
    assert f"the SSH connection to deploy@{h.addr} broke" in up.output, up.output
    assert "run `pulumi up` again" in up.output

    # The install that lost its session stops at its next write, before changing anything.
    assert wait_until(lambda: not install_running(h), 3 * SLOW_DELAY + 10), host_processes(h)
    for path in (BINARY, CONFIG, UNIT):
        assert h.read_file(path) is None, f"{path} was installed by a run whose session had died"
    left = leftovers(h, cluster)
    assert left == [], left
    state_after = state_summary(stack)

    timing = converges(stack)
    assert_agent_as(h, cluster, build_llmgw(RELEASE))
    assert leftovers(h, cluster) == []
    assert_state_clean(stack)
    report("ssh-killed-mid-install", saw=line, killed=killed, state_after=kinds(state_after["urns"]),
           pending=state_after["pending"], seconds=round(time.monotonic() - t0, 1), **timing)


# --------------------------------------------------------------------------- 2. release server faults during an upgrade


@pytest.fixture(scope="module")
def corrupt_root(tmp_path_factory: pytest.TempPathFactory, cluster: Any) -> Path:
    """A release archive whose v1.5.0 amd64 file was corrupted in transit or at rest (its checksums.txt signed)."""
    root = tmp_path_factory.mktemp("corrupt-releases")
    good = build_llmgw(NEXT_RELEASE)
    publish_release(root, NEXT_RELEASE, {"amd64": good}, tamper={"amd64": good[:-200] + b"\x00" * 200},
                    sign_with=cluster.release_signing_key_path)
    return root


def test_release_server_faults_during_an_upgrade_keep_the_running_agent(lab, cluster, hosts, new_stack, release_tls,
                                                                        corrupt_root):
    """One node, onboarded once, meets each fault of the release server in turn (nothing listening, a response held
    past the stall limit, a corrupted binary): each upgrade fails with its reason and leaves the running agent, its
    stream and the node as they were, so the next fault starts from the same node. Then the server is fixed and the
    same upgrade goes through."""
    t0 = time.monotonic()
    (h,) = hosts(1)
    config = stack_config(cluster, [h])
    stack = new_stack(config)
    assert stack.up().ok
    before = agent_facts(h, cluster)
    assert before["active"] == "active" and before[BINARY] == sha(build_llmgw(RELEASE)), before
    assert cluster.control_plane.wait_for({h.hostname}, timeout=20)

    servers = {
        "down": lambda: _nothing(f"https://{release_tls[0]}:{PORT_DOWN}"),  # nothing listens there
        # holds every response far longer than the node's stall limit
        "stalled": lambda: release_server(lab, release_tls, cluster.release_root, PORT_STALLED, delay=120),
        "corrupt": lambda: release_server(lab, release_tls, corrupt_root, PORT_CORRUPT),
    }
    for fault, server in servers.items():
        n_events = len(cluster.control_plane.events)
        with server() as url:
            stack.set_config({**config, "agent": {"version": NEXT_RELEASE, "releaseUrl": url,
                                                  "signingKey": cluster.release_signing_key}})
            up = stack.up()
        assert not up.ok, (fault, up.output)
        expected = {  # checksums.txt is fetched on the operator's side (once per up), before any node is reached
            "down": [f"cannot download {url}/{NEXT_RELEASE}/checksums.txt", "no node was changed"],
            "stalled": [f"cannot download {url}/{NEXT_RELEASE}/checksums.txt", "timed out", "no node was changed"],
            "corrupt": ["llmgw binary for amd64 has sha256", "was expected; nothing was installed"],
        }[fault]
        for words in expected:
            assert words in up.output, (fault, up.output)
        line = key_line(up.output, "cannot download", "llmgw binary for", "error:")

        after = agent_facts(h, cluster)
        assert after == before, f"the running agent was touched by an upgrade that failed ({fault})"
        assert h.hostname in cluster.control_plane.connected(), fault
        assert not [e for e in cluster.control_plane.events[n_events:] if e.node_id == h.hostname], \
            f"the agent's stream was interrupted ({fault})"
        assert leftovers(h, cluster) == [], fault
        report(f"release-{fault}-during-upgrade", saw=line, failed_run_s=round(up.seconds, 1))

    # The release server is fixed (here: the healthy one): the same upgrade goes through.
    stack.set_config({**config, "agent": {"version": NEXT_RELEASE, "releaseUrl": cluster.release_url,
                                          "signingKey": cluster.release_signing_key}})
    timing = converges(stack)
    assert_agent_as(h, cluster, build_llmgw(NEXT_RELEASE))
    assert leftovers(h, cluster) == []
    report("release-faults-during-upgrade", seconds=round(time.monotonic() - t0, 1), **timing)


@contextmanager
def _nothing(value: str) -> Iterator[str]:
    yield value


def onboarded_node(cluster: Any, hosts: Any, new_stack: Any) -> tuple[Any, dict, Any, dict, str]:
    """One freshly onboarded node: (host, config, stack, its agent facts, its agent.yaml)."""
    (h,) = hosts(1)
    config = stack_config(cluster, [h])
    stack = new_stack(config)
    assert stack.up().ok
    return h, config, stack, agent_facts(h, cluster), ssh(h, cluster, f"sudo cat {CONFIG}")[1]


# --------------------------------------------------------------------------- 3. disk full while writing config


def test_disk_full_while_writing_the_config_keeps_the_previous_one(cluster, hosts, new_stack):
    t0 = time.monotonic()
    h, config, stack, before, old_yaml = onboarded_node(cluster, hosts, new_stack)

    # /etc/llmgw becomes a tiny file system holding the same files, then fills up.
    rc, out = ssh(h, cluster, "sudo sh -c 'cp -a /etc/llmgw /root/llmgw-copy && "
                              "mount -t tmpfs -o size=64k,mode=0755 llmgw-full /etc/llmgw && "
                              "cp -a /root/llmgw-copy/. /etc/llmgw/ && "
                              "{ dd if=/dev/zero of=/etc/llmgw/filler bs=4k 2>/dev/null || true; } && "
                              "df --output=avail -B1 /etc/llmgw | tail -n 1'")
    assert rc == 0 and out.split()[-1] == "0", out

    stack.set_config({**config, "servers": [cluster.control_plane.address, cluster.standby.address]})
    up = stack.up()
    assert not up.ok
    assert "cannot write /etc/llmgw/agent.yaml" in up.output, up.output
    line = key_line(up.output, "cannot write", "No space", "error:")

    assert ssh(h, cluster, f"sudo cat {CONFIG}")[1] == old_yaml, "the previous config was damaged"
    after = agent_facts(h, cluster)
    assert after == before, "the agent or its files changed"
    left = leftovers(h, cluster)
    assert left == [], left

    ssh(h, cluster, "sudo rm -f /etc/llmgw/filler")
    timing = converges(stack)
    facts = agent_facts(h, cluster)
    assert facts["active"] == "active" and facts[CONFIG] != before[CONFIG]
    assert cluster.standby.address in ssh(h, cluster, f"sudo cat {CONFIG}")[1]
    assert leftovers(h, cluster) == []
    report("disk-full-writing-config", saw=line, seconds=round(time.monotonic() - t0, 1), **timing)


# --------------------------------------------------------------------------- 4. the new agent will not start


@pytest.fixture(scope="module")
def broken_start_release(cluster: Any) -> str:
    """A release whose amd64 agent exits 1 at once, after one line on stderr."""
    if not (cluster.release_root / BROKEN_START).exists():
        # It reports its tag (a release must, before it is installed), then fails as an agent.
        script = (f"#!/bin/sh\n[ \"$1\" != --version ] || {{ echo 'llmgw version {BROKEN_START}'; exit 0; }}\n"
                  f"echo '{FATAL_LINE}' >&2\nexit 1\n").encode()
        publish_release(cluster.release_root, BROKEN_START, {"amd64": script}, sign_with=cluster.release_signing_key_path)
    return BROKEN_START


def test_an_agent_that_fails_to_start_after_an_upgrade_is_rolled_back(cluster, hosts, new_stack, broken_start_release):
    t0 = time.monotonic()
    h, config, stack, before, old_yaml = onboarded_node(cluster, hosts, new_stack)

    # New version and new settings in one go: both must be undone.
    changed = {**config, "servers": [cluster.control_plane.address, cluster.standby.address],
               "agent": {"version": broken_start_release, "releaseUrl": cluster.release_url, "signingKey": cluster.release_signing_key}}
    stack.set_config(changed)
    up = stack.up()
    assert not up.ok
    assert "the agent did not stay running; the end of its journal:" in up.output, up.output
    assert FATAL_LINE in up.output, "the journal's end is not in the error"
    assert "the previous binary and config were restored" in up.output
    line = key_line(up.output, "did not stay running", "error:")

    after = agent_facts(h, cluster)
    assert after["active"] == "active", after
    assert {k: after[k] for k in (BINARY, CONFIG, UNIT)} == {k: before[k] for k in (BINARY, CONFIG, UNIT)}
    assert ssh(h, cluster, f"sudo cat {CONFIG}")[1] == old_yaml
    assert cluster.control_plane.wait_for({h.hostname}, timeout=20), "the restored agent did not reconnect"
    assert leftovers(h, cluster) == []

    # The operator goes back to the release that works, keeping the new settings.
    stack.set_config({**changed, "agent": config["agent"]})
    timing = converges(stack)
    assert_agent_as(h, cluster, build_llmgw(RELEASE))
    assert cluster.standby.address in ssh(h, cluster, f"sudo cat {CONFIG}")[1]
    report("agent-fails-to-start-after-upgrade", saw=line, seconds=round(time.monotonic() - t0, 1), **timing)


# --------------------------------------------------------------------------- 5. reboot mid-onboarding


def test_a_reboot_in_the_middle_of_onboarding(cluster, hosts, new_stack, slow_release):
    t0 = time.monotonic()
    (h,) = hosts(1)
    stack = new_stack(stack_config(cluster, [h], agent={"version": RELEASE, "releaseUrl": slow_release,
                                                        "signingKey": cluster.release_signing_key}))

    def reboot() -> list[str]:
        """Where the download was being written when the host went down; then the reboot."""
        writing = [cmd for _, cmd in host_processes(h) if cmd.startswith("curl ")]
        h.reboot()
        return writing

    injector = Injector(lambda: downloading(h), reboot)
    injector.start()
    up = stack.up()
    writing = injector.done()  # asserts the reboot happened, during the download
    # Staged in /run, a tmpfs: a reboot empties it even when the script had no time to clean up after itself.
    assert writing and all(" -o /run/llmgw-stage." in cmd for cmd in writing), writing
    assert h.running
    # The node went down under the command: the run fails, saying so and what to do.
    assert not up.ok
    assert "RemoteCommandError" in up.output and "run `pulumi up` again" in up.output, up.output
    line = key_line(up.output, "RemoteCommandError", "error:")
    after_run = {p: h.read_file(p) is not None for p in (BINARY, CONFIG, UNIT)}
    assert after_run == {BINARY: False, CONFIG: False, UNIT: False}, f"an install the reboot cut short: {after_run}"
    # The download was staged in /run, which a reboot empties: nothing is left anywhere.
    assert leftovers(h, cluster) == []

    timing = converges(stack)
    assert_agent_as(h, cluster, build_llmgw(RELEASE))
    assert_state_clean(stack)
    assert leftovers(h, cluster) == [], "the next run did not sweep what the reboot left"
    report("reboot-mid-onboarding", saw=line, up_ok=up.ok, installed_after_fault=after_run,
           seconds=round(time.monotonic() - t0, 1), **timing)


# --------------------------------------------------------------------------- 5b. a change killed outright


def test_a_change_killed_outright_is_undone_by_the_next_run(cluster, hosts, new_stack):
    """SIGKILL or a power cut cannot be trapped: the script leaves its change half-done, and the next run repairs it."""
    t0 = time.monotonic()
    (h,) = hosts(1)
    config = stack_config(cluster, [h])
    stack = new_stack(config)
    assert stack.up().ok
    # What an upgrade killed right after it replaced the binary leaves behind: the new (here: broken)
    # binary in place, the previous one kept aside, a staged config, a staging dir.
    rc, out = ssh(h, cluster, "sudo sh -c 'cd /usr/local/bin && ln -f llmgw llmgw.llmgw-prev && "
                              "printf \"#!/bin/sh\\nexit 1\\n\" > llmgw.x && chmod 755 llmgw.x && mv -f llmgw.x llmgw && "
                              "umask 077 && : > /etc/llmgw/agent.yaml.llmgw-new.Ab12Cd && mkdir /run/llmgw-stage.Zz99Yy'")
    assert rc == 0, out
    assert len(leftovers(h, cluster)) == 3

    stack.set_config({**config, "servers": [cluster.control_plane.address, cluster.standby.address]})
    up = stack.up()
    assert up.ok, up.output
    assert_agent_as(h, cluster, build_llmgw(RELEASE))
    assert cluster.standby.address in ssh(h, cluster, f"sudo cat {CONFIG}")[1]
    assert leftovers(h, cluster) == []
    timing = converges(stack)
    report("change-killed-outright", saw="(up succeeded)", seconds=round(time.monotonic() - t0, 1), **timing)


# --------------------------------------------------------------------------- 6. pulumi up interrupted


def pulumi_up_pid(engine_bin: Path) -> int | None:
    """The `pulumi up` CLI process this test process started (a child of it)."""
    from lab.vmctl import processes

    exe = str(engine_bin / "pulumi")
    for pid, ppid, argv in processes():
        if ppid == os.getpid() and argv and argv[0].decode(errors="replace") in (exe, "pulumi") and b"up" in argv[1:]:
            return pid
    return None


def processes_of(pulumi_home: Path) -> list[int]:
    """Processes (other than this one) running with this test's PULUMI_HOME: the CLI and its plugins."""
    needle = f"PULUMI_HOME={pulumi_home}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.append(int(d.name))
    return found


def lock_files(state_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(state_dir)) for p in state_dir.rglob("*") if p.is_file() and "/locks/" in str(p))


@pytest.mark.parametrize(("sig", "checkpoints"), [(signal.SIGINT, True), (signal.SIGKILL, True), (signal.SIGKILL, False)],
                         ids=["SIGINT", "SIGKILL", "SIGKILL-checkpoints-skipped"])
def test_pulumi_up_interrupted_mid_deployment(sig, checkpoints, cluster, hosts, new_stack, slow_release, tmp_path):
    """Interrupted while the agent is being installed, after the node's certificate is in place: the next runs
    converge, and keep that certificate. Without checkpoints (PULUMI_SKIP_CHECKPOINTS, the engine writing the state
    once, when a run ends), a killed run leaves no state of what it did: the next `up` creates every resource
    again, and the node's certificate, issued by this CA for its own key, is taken over as it is, not re-issued."""
    t0 = time.monotonic()
    (h,) = hosts(1)
    stack = new_stack(stack_config(cluster, [h], agent={"version": RELEASE, "releaseUrl": slow_release,
                                                        "signingKey": cluster.release_signing_key}))
    if not checkpoints:
        stack.env["PULUMI_SKIP_CHECKPOINTS"] = "true"

    def interrupt() -> int:
        pid = pulumi_up_pid(cluster.engine_bin)
        assert pid is not None, "the pulumi CLI process was not found"
        os.kill(pid, sig)
        return pid

    injector = Injector(lambda: downloading(h), interrupt)
    injector.start()
    try:
        up = stack.up()
        injector.done()
        assert not up.ok
        line = key_line(up.output, "error:", "cancel", "interrupt", "code:")
        locks = lock_files(tmp_path / "state")
        pending = state_summary(stack)["pending"]
        # The install the interrupted run had begun ends by itself, one way or the other.
        assert wait_until(lambda: not install_running(h), 3 * SLOW_DELAY + 10), host_processes(h)
        installed = {p: h.read_file(p) is not None for p in (BINARY, CONFIG, UNIT)}
        assert len(set(installed.values())) == 1, f"half an install: {installed}"
        assert leftovers(h, cluster) == []
        alive = [_cmdline(pid) for pid in processes_of(tmp_path / "pulumi-home")]
        issued = h.read_file(AGENT_CERT)
        assert issued is not None, "interrupted before the certificate was installed: the test proves nothing"
        if not checkpoints:
            assert state_summary(stack)["urns"] == [], "a run without checkpoints wrote state before it ended"

        # Recover as an operator would: a stale lock is cancelled; creates the engine never heard
        # the end of are dropped from state by `pulumi refresh --clear-pending-creates` (a plain
        # refresh keeps them when not interactive, and every later run warns about them).
        steps = []
        refresh = stack.refresh()
        if not refresh.ok and "locked" in refresh.output:
            steps.append("pulumi cancel")
            stack.cancel()
            refresh = stack.refresh()
        assert refresh.ok, refresh.output
        if state_summary(stack)["pending"]:
            steps.append("pulumi refresh --clear-pending-creates")
            refresh = stack.refresh(clear_pending_creates=True)
            assert refresh.ok, refresh.output
        timing = converges(stack)
    finally:
        orphans = processes_of(tmp_path / "pulumi-home")
        for pid in orphans:  # e.g. the provider plugin a SIGKILLed CLI left running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    assert_agent_as(h, cluster, build_llmgw(RELEASE))
    assert_state_clean(stack)
    assert h.read_file(AGENT_CERT) == issued, "the node's certificate was issued again"
    assert leftovers(h, cluster) == []
    rc, units = ssh(h, cluster, "systemctl list-unit-files --no-legend 'llmgw*'")
    assert len(units.splitlines()) == 1 and units.startswith("llmgw-agent.service"), units
    assert lock_files(tmp_path / "state") == []
    report(f"pulumi-up-{sig.name}" + ("" if checkpoints else "-checkpoints-skipped"), saw=line, locks_left=locks,
           pending_after=[p.get("type") for p in pending],
           installed_after_interrupt=installed, processes_left_by_the_cli=alive, recovery=steps,
           seconds=round(time.monotonic() - t0, 1), **timing)


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "(gone)"


# --------------------------------------------------------------------------- 7. a bad CA


def _ca(directory: Path, key: Any, not_before: dt.datetime, not_after: dt.datetime) -> None:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmgw test CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True)
    (directory / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "ca-key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    (directory / "ca-key.pem").chmod(0o600)


def test_a_bad_ca_fails_before_anything_reaches_the_node(cluster, hosts, new_stack, tmp_path):
    t0 = time.monotonic()
    (h,) = hosts(1)
    mismatched = tmp_path / "pki-mismatched"
    mismatched.mkdir()
    shutil.copy(cluster.pki_dir / "ca.pem", mismatched / "ca.pem")
    (mismatched / "ca-key.pem").write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (mismatched / "ca-key.pem").chmod(0o600)  # a CA key as it is kept: only the mismatch is wrong
    now = dt.datetime.now(dt.UTC)
    expired = tmp_path / "pki-expired"
    _ca(expired, ec.generate_private_key(ec.SECP256R1()), now - dt.timedelta(days=400), now - dt.timedelta(days=35))

    opens = h.passive_tcp_opens()
    config = stack_config(cluster, [h])
    stack = new_stack({**config, "pkiDir": str(mismatched)})
    up = stack.up()
    assert not up.ok
    assert f"ca-key.pem does not belong to ca.pem in {mismatched}" in up.output, up.output
    assert "restore the matching pair from backup" in up.output
    saw_mismatch = key_line(up.output, "does not belong")

    stack.set_config({**config, "pkiDir": str(expired)})
    up = stack.up()
    assert not up.ok
    assert f"the CA in {expired} expired on {(now - dt.timedelta(days=35)):%Y-%m-%d}" in up.output, up.output
    assert "rotate the cluster CA" in up.output
    saw_expired = key_line(up.output, "expired on")

    assert h.passive_tcp_opens() == opens, "an SSH connection was made with an unusable CA"
    assert not (h.upper / "etc" / "llmgw").exists()
    custom = [u for u in state_summary(stack)["urns"] if "pulumi:providers:" not in u and "pulumi:pulumi:Stack" not in u]
    assert [u.split("::")[-2] for u in custom] == ["llmgw:index:Node"], custom  # no certificate, no identity

    stack.set_config(config)
    timing = converges(stack)
    assert_agent_as(h, cluster, build_llmgw(RELEASE))
    report("bad-ca", saw=[saw_mismatch, saw_expired], state_after_failures=custom,
           seconds=round(time.monotonic() - t0, 1), **timing)
