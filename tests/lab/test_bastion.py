"""The lab's jump-host topology (lab/hosts.py): private hosts behind a bastion.

Real systemd-nspawn hosts and OpenSSH, so root, systemd-nspawn and the rootfs are
needed. The lab is this module's own, torn down by its last tests, so it must not
share a name with the session lab of tests/e2e: LLMGW_BASTION_LAB=name:subnet[:private]
(default b:10.254.0, private segment 10.254.128).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import pki
from lab.control_plane import ControlPlane
from lab.hosts import Host, Lab, entered_netns
from lab.release_server import publish_release

NAME, SUBNET, *PRIVATE = os.environ.get("LLMGW_BASTION_LAB", "b:10.254.0").split(":")
REPO_ROOT = Path(__file__).resolve().parents[2]
CONNECT_TIMEOUT = 3.0

pytestmark = [
    pytest.mark.hosts,
    pytest.mark.xdist_group("lab-bastion"),  # one lab of a fixed name: all of this file in one test process
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("systemd-nspawn") is None or shutil.which("ssh") is None,
        reason="needs root, systemd-nspawn and OpenSSH",
    ),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with Lab(NAME, SUBNET, tmp_path_factory.mktemp("lab"), private_subnet="".join(PRIVATE)) as lab:
        yield lab


@pytest.fixture(scope="module")
def bastion(lab: Lab) -> Host:
    host = lab.prepare(1, hostname="bastion", segment="both")
    host.start()
    return host


@pytest.fixture(scope="module")
def node(lab: Lab) -> Host:
    host = lab.prepare(2, hostname="gpu-private-2", segment="private")
    host.start()
    return host


def ssh(lab: Lab, host: Host, command: str, jump: Host | None = None) -> subprocess.CompletedProcess[str]:
    """`ssh [-J deploy@<jump>] deploy@<host> command` with OpenSSH, in the root namespace.

    The options are in a config file, since -F (unlike -i and -o) reaches the jump's ssh too.
    """
    config = lab.workdir / "ssh_config"
    config.write_text(
        f"Host *\n  User deploy\n  IdentityFile {lab.ssh_key_path}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        f"  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 10\n"
    )
    hop = ["-J", f"deploy@{jump.addr}"] if jump else []
    argv = ["ssh", "-F", str(config), *hop, f"deploy@{host.addr}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def tcp_from(lab: Lab, host: Host, addr: str, port: int, jump: Host | None = None) -> int:
    """Exit status of a TCP connect from `host` to addr:port (0: connected)."""
    return ssh(lab, host, f"timeout {CONNECT_TIMEOUT} bash -c 'exec 3<>/dev/tcp/{addr}/{port}'", jump).returncode


def test_private_host_is_unreachable_from_the_root_namespace(lab: Lab, bastion: Host, node: Host) -> None:
    assert node.addr == lab.private_addr(2) and node.addr.startswith(f"{lab.private_subnet}.")
    route = subprocess.run(["ip", "route", "get", node.addr], capture_output=True, text=True, check=False)
    assert route.returncode != 0, route.stdout  # not even by the machine's default route
    start = time.monotonic()
    with pytest.raises(OSError), socket.create_connection((node.addr, 22), timeout=CONNECT_TIMEOUT):
        pass
    assert time.monotonic() - start < CONNECT_TIMEOUT + 0.5
    # Not because its sshd is down: from the bastion's netns it answers.
    with entered_netns(bastion.netns), socket.create_connection((node.addr, 22), timeout=CONNECT_TIMEOUT) as sock:
        assert sock.recv(64).startswith(b"SSH-")


def test_ssh_through_the_bastion_reaches_the_private_host(lab: Lab, bastion: Host, node: Host) -> None:
    done = ssh(lab, node, "hostname; ip route", jump=bastion)
    assert done.returncode == 0, done.stderr
    name, *routes = done.stdout.splitlines()
    assert name == node.hostname
    assert routes == [f"{lab.private_subnet}.0/24 dev eth0 proto kernel scope link src {node.addr} "]


def test_bastion_relays_channels_not_packets(lab: Lab, bastion: Host, node: Host) -> None:
    done = ssh(lab, bastion, "cat /proc/sys/net/ipv4/ip_forward; ip -4 -o addr show scope global; "
                             "sudo -n sshd -T | grep -i '^allowtcpforwarding'")  # fmt: skip
    assert done.returncode == 0, done.stderr
    forward, *addrs, tcp_forwarding = done.stdout.splitlines()
    assert forward == "0"
    assert [a.split()[3] for a in addrs] == [f"{bastion.addr}/24", f"{bastion.private_addr}/24"]
    assert tcp_forwarding == "allowtcpforwarding yes"


def test_private_host_reaches_private_services_and_not_the_main_bridge(
    lab: Lab, bastion: Host, node: Host, tmp_path: Path
) -> None:
    publish_release(tmp_path / "releases", "v1", {"amd64": b"binary"})
    release_addr = f"{lab.private_subnet}.2"
    server = lab.run_in_netns(
        [sys.executable, "-m", "lab.release_server", "--root", str(tmp_path / "releases"), "--bind", release_addr,
         "--port", "8080"],
        netns_suffix="rel", addr_index=2, segment="private", cwd=str(REPO_ROOT), stdout=subprocess.PIPE,
    )  # fmt: skip
    assert server.stdout is not None and b"listening" in server.stdout.readline()
    pki.init_ca(tmp_path / "pki")
    cp_netns = lab.add_netns("cp", 3, segment="private")
    with ControlPlane(tmp_path / "pki", f"{lab.private_subnet}.3", netns=cp_netns) as control_plane:
        done = ssh(lab, node, f"curl -fsS http://{release_addr}:8080/v1/checksums.txt", jump=bastion)
        assert done.returncode == 0 and "llmgw-v1-linux-amd64" in done.stdout, done.stderr
        # A TCP connection with no TLS: the in-process control plane records the failed handshake.
        assert tcp_from(lab, node, control_plane.host, control_plane.port, jump=bastion) == 0
        assert control_plane.wait_for_event(lambda e: e.outcome.startswith("tls-failed"), timeout=10)
    with socket.create_server((lab.gateway, 0)) as listener:  # in the root namespace, on the main bridge
        port = listener.getsockname()[1]
        assert tcp_from(lab, bastion, lab.gateway, port) == 0  # the main segment reaches it
        assert tcp_from(lab, node, lab.gateway, port, jump=bastion) != 0


def leftovers(lab: Lab) -> list[str]:
    """This lab's netns, root-namespace links, private route and host mounts still present."""

    def lines(*argv: str) -> list[str]:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()

    found = [f"netns {ln.split()[0]}" for ln in lines("ip", "netns", "list") if ln.startswith(lab.prefix)]
    found += [f"link {ln.split(':')[1].strip()}" for ln in lines("ip", "-o", "link") if f": {lab.prefix}" in ln]
    found += [f"route {ln}" for ln in lines("ip", "route", "show", "table", "all", "root", f"{lab.private_subnet}.0/24")]
    found += [f"mount {ln.split()[4]}" for ln in Path("/proc/self/mountinfo").read_text().splitlines()
              if ln.split()[4].startswith(str(lab.workdir))]  # fmt: skip
    return found


def test_teardown_removes_the_private_segment(lab: Lab, bastion: Host, node: Host) -> None:
    assert f"netns {lab.private_netns}" in leftovers(lab)
    lab.teardown()
    assert leftovers(lab) == []


def test_setup_sweeps_the_private_segment_of_a_killed_run(lab: Lab) -> None:
    script = textwrap.dedent(f"""
        import os, pathlib, signal
        from lab.hosts import Lab
        lab = Lab({NAME!r}, {SUBNET!r}, pathlib.Path({str(lab.workdir)!r}), private_subnet={lab.private_subnet!r})
        lab.setup()
        lab.prepare(1, segment="both")
        lab.prepare(2, segment="private").start()
        lab.run_in_netns(["sleep", "600"], netns_suffix="rel", segment="private")
        os.kill(os.getpid(), signal.SIGKILL)  # a run killed with everything up
    """)
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL
    left = leftovers(lab)
    assert f"netns {lab.private_netns}" in left and f"netns {lab.prefix}rel" in left
    assert any(x.startswith("route unreachable") for x in left)
    lab.setup()
    assert [x for x in leftovers(lab) if x not in (f"link {lab.bridge}", f"mount {lab.hosts_dir}")] == []  # what setup makes
    lab.teardown()
    assert leftovers(lab) == []
