"""Tests of the test-host harness (lab/hosts.py).

The `hosts`-marked tests boot real systemd-nspawn hosts, so they need root,
systemd-nspawn and the Debian rootfs (lab/rootfs.sh, cached after its first run).
They use lab "x" on 10.252.0.0/24, so they never collide with the default test
lab "t" (10.250.0) or a local demo lab "l" (10.251.0).

The other tests are pure and run anywhere.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import paramiko
import pytest

from lab import linux
from lab.hosts import CGROUP_ROOTS, Host, Lab, LabError, NetemUnavailable, _resolve_inside

NAME, SUBNET = "x", "10.252.0"
# Labs of fixed names (x, y, z): all of this file runs in one test process under pytest-xdist.
pytestmark = pytest.mark.xdist_group("lab-x")
PREFIX = f"lg{NAME}"
REPO_ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- pure tests


def test_lab_name_and_subnet_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="1-3 lowercase"):
        Lab(name="toolong", subnet=SUBNET, workdir=tmp_path)
    with pytest.raises(ValueError, match="three octets"):
        Lab(name="x", subnet="10.252.0.0", workdir=tmp_path)
    lab = Lab(name="abc", subnet="10.251.7", workdir=tmp_path)
    assert lab.gateway == "10.251.7.1"
    assert lab.bridge == "lgabcbr"
    assert lab.addr(200) == "10.251.7.220"


def test_a_lab_of_more_than_234_hosts_spans_a_slash_21(tmp_path: Path) -> None:
    small = Lab(name="abc", subnet="10.251.8", workdir=tmp_path)
    assert small.prefix_len == 24
    with pytest.raises(ValueError, match="host index must be 1..200"):
        small.prepare(201)
    big = Lab(name="abc", subnet="10.251.8", workdir=tmp_path, max_hosts=1000)
    assert big.prefix_len == 21
    assert [big.addr(i) for i in (1, 234, 235, 1000)] == ["10.251.8.21", "10.251.8.254", "10.251.8.255", "10.251.11.252"]
    assert big.gateway == "10.251.8.1"
    with pytest.raises(ValueError, match="private segment needs an index of 1..234"):
        big.prepare(235, segment="private")
    with pytest.raises(ValueError, match="multiple of 8"):
        Lab(name="abc", subnet="10.251.7", workdir=tmp_path, max_hosts=235)
    with pytest.raises(ValueError, match="max_hosts must be 1..2026"):
        Lab(name="abc", subnet="10.251.8", workdir=tmp_path, max_hosts=2027)


def test_extra_netns_suffix_is_validated(tmp_path: Path) -> None:
    lab = Lab(name="abc", subnet="10.251.7", workdir=tmp_path)
    for bad in ("h1", "br", "Repo", "waytoolongsuffix"):
        with pytest.raises(ValueError):
            lab.run_in_netns(["true"], netns_suffix=bad)


def test_paths_resolve_inside_the_host_root(tmp_path: Path) -> None:
    """An absolute symlink in a host points into the host, not into the lab machine."""
    root = tmp_path / "root"
    (root / "usr/share/zoneinfo").mkdir(parents=True)
    (root / "usr/share/zoneinfo/UTC").write_text("utc")
    (root / "etc").mkdir()
    (root / "etc/localtime").symlink_to("/usr/share/zoneinfo/UTC")
    (root / "etc/rel").symlink_to("../usr/share/zoneinfo/UTC")
    (root / "etc/up").symlink_to("../../../../../usr")
    assert _resolve_inside(root, "/etc/localtime") == root / "usr/share/zoneinfo/UTC"
    assert _resolve_inside(root, "etc/rel") == root / "usr/share/zoneinfo/UTC"
    assert _resolve_inside(root, "/etc/up/share") == root / "usr/share"
    with pytest.raises(FileNotFoundError):
        _resolve_inside(root, "/etc/missing/file")


# --------------------------------------------------------------------------- real hosts

needs_hosts = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
    reason="needs root and systemd-nspawn",
)


class Ssh:
    """A paramiko connection to a lab host, with the lab key."""

    def __init__(self, lab: Lab, host: Host, user: str = "deploy") -> None:
        self.client = paramiko.SSHClient()
        self.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        key = paramiko.Ed25519Key.from_private_key_file(str(lab.ssh_key_path))
        self.client.connect(host.addr, username=user, pkey=key, look_for_keys=False, allow_agent=False, timeout=10)

    def run(self, command: str, stdin: str | None = None) -> tuple[int, str, str]:
        chan_in, out, err = self.client.exec_command(command, timeout=60)
        if stdin is not None:
            chan_in.write(stdin)
            chan_in.channel.shutdown_write()
        stdout, stderr = out.read().decode(), err.read().decode()
        return out.channel.recv_exit_status(), stdout, stderr

    def host_key(self) -> paramiko.PKey:
        transport = self.client.get_transport()
        assert transport is not None
        return transport.get_remote_server_key()

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_as(lab: Lab, host: Host, command: str, user: str = "deploy", stdin: str | None = None) -> tuple[int, str, str]:
    with Ssh(lab, host, user) as ssh:
        return ssh.run(command, stdin)


#: The kernel objects lab "x" names (hosts, its one extra netns "repo", the private segment, veths, bridge, base layer
#: and nspawn tmpfs mounts): by full name, so that another lab whose name starts with "x" (e.g. "xb", an xdist
#: worker's lab of another run on the machine) is not taken for ours.
OURS = re.compile(rf"{PREFIX}(h\d+|repo|-priv|v(\d+|repo)|br|base|run)(@\S*)?")


def leftovers(lab: Lab) -> list[str]:
    """Everything of this lab's name that is still in the kernel or in the process table."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if OURS.fullmatch(line.split()[0])]
    links = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True, text=True).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if OURS.fullmatch(line.split(":")[1].strip())]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mountpoint, source = line.split()[4], line.split(" - ")[1].split()[1]
        if OURS.fullmatch(source) or mountpoint.startswith(str(lab.workdir)):
            found.append(f"mount {mountpoint}")
    found += [f"cgroup {cg / PREFIX}" for cg in CGROUP_ROOTS if (cg / PREFIX).exists()]
    for pid_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (pid_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if b"systemd-nspawn" in cmdline and str(lab.workdir).encode() in cmdline:
            found.append(f"process {pid_dir.name}")
    return found


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with Lab(name=NAME, subnet=SUBNET, workdir=tmp_path_factory.mktemp("lab")) as lab:
        yield lab


@pytest.fixture(scope="module")
def hosts(lab: Lab) -> list[Host]:
    lab.prepare(3, hostname="gpu-box-3")  # a hostname that differs from the node id
    return lab.boot(3)


@pytest.mark.hosts
@needs_hosts
class TestHosts:
    """One lab of 3 hosts for the whole class; the last tests tear it down and check that."""

    def test_key_and_layout(self, lab: Lab, hosts: list[Host]) -> None:
        assert lab.gateway == "10.252.0.1"
        assert lab.ssh_key_path.stat().st_mode & 0o777 == 0o600
        assert lab.ssh_private_key.startswith("-----BEGIN OPENSSH " + "PRIVATE KEY-----")
        assert [h.addr for h in hosts] == ["10.252.0.21", "10.252.0.22", "10.252.0.23"]
        assert [h.name for h in hosts] == ["lgxh1", "lgxh2", "lgxh3"]
        assert [h.hostname for h in hosts] == ["node1", "node2", "gpu-box-3"]
        assert all(h.running for h in hosts)

    @pytest.mark.parametrize("i", [0, 1, 2])
    def test_host_is_a_booted_debian_with_sudo(self, lab: Lab, hosts: list[Host], i: int) -> None:
        host = hosts[i]
        with Ssh(lab, host) as ssh:
            assert ssh.run("hostname")[1].strip() == host.hostname
            assert ssh.run("sudo -n id -u")[1].strip() == "0"
            state = ssh.run("timeout 20 systemctl is-system-running --wait")[1].strip()
            assert state in ("running", "degraded"), ssh.run("systemctl --failed --no-legend")[1]
            assert ssh.run("systemd-detect-virt")[1].strip() == "systemd-nspawn"

    def test_neither_a_host_nor_the_bridge_solicits_an_ipv6_router(self, lab: Lab, hosts: list[Host]) -> None:
        # lab/network.py, no_router_solicitations: each solicitation is flooded to every host of the bridge.
        conf = Path("/proc/sys/net/ipv6/conf")
        if not conf.is_dir():
            pytest.skip("this machine has no IPv6: nothing solicits a router")
        assert (conf / "default/router_solicitations").read_text().strip() != "0"  # the machine's own default does
        seen = [linux.run([*linux.nsenter(h.netns), "cat", str(conf / "eth0/router_solicitations")]).stdout.strip()
                for h in hosts]
        assert seen == ["0"] * len(hosts)
        assert (conf / lab.bridge / "router_solicitations").read_text().strip() == "0"

    def test_nosudo_has_no_sudo_rights(self, lab: Lab, hosts: list[Host]) -> None:
        rc, _, err = run_as(lab, hosts[0], "sudo -n true", user="nosudo")
        assert rc != 0 and "sudo:" in err
        _, out, _ = run_as(lab, hosts[0], "sudo -n -l -U nosudo")
        assert "is not allowed to run sudo" in out

    def test_pwsudo_needs_a_password(self, lab: Lab, hosts: list[Host]) -> None:
        rc, _, err = run_as(lab, hosts[0], "sudo -n true", user="pwsudo")
        assert rc != 0
        assert "a password is required" in err
        rc, out, _ = run_as(lab, hosts[0], "sudo -S -p '' id -u", user="pwsudo", stdin=lab.pwsudo_password + "\n")
        assert (rc, out.strip()) == (0, "0")

    def test_files_written_on_a_host_stay_on_that_host(self, lab: Lab, hosts: list[Host]) -> None:
        h1, h2 = hosts[0], hosts[1]
        rc, _, err = run_as(
            lab, h1, "echo hello | sudo tee /etc/lab-marker >/dev/null && sudo chmod 640 /etc/lab-marker"
        )
        assert rc == 0, err
        assert h1.read_file("/etc/lab-marker") == b"hello\n"
        assert (h1.upper / "etc/lab-marker").read_bytes() == b"hello\n"
        st = h1.stat("/etc/lab-marker")
        assert st is not None and (st.st_mode & 0o777, st.st_uid) == (0o640, 0)
        assert h2.read_file("/etc/lab-marker") is None
        assert h2.stat("/etc/lab-marker") is None

    def test_stat_sees_authorized_keys_as_the_host_does(self, lab: Lab, hosts: list[Host]) -> None:
        st = hosts[1].stat("/home/deploy/.ssh/authorized_keys")
        assert st is not None and st.st_mode & 0o777 == 0o600
        rc, uid, _ = run_as(lab, hosts[1], "id -u")
        assert rc == 0 and st.st_uid == int(uid)

    def test_passive_tcp_opens_counts_ssh_connections(self, lab: Lab, hosts: list[Host]) -> None:
        host = hosts[1]
        before = host.passive_tcp_opens()
        run_as(lab, host, "true")
        assert host.passive_tcp_opens() == before + 1
        with Ssh(lab, host) as ssh:  # several commands on one connection count once
            for _ in range(3):
                ssh.run("true")
        assert host.passive_tcp_opens() == before + 2

    def test_hosts_have_no_default_route(self, lab: Lab, hosts: list[Host]) -> None:
        for host in hosts:
            _, routes, _ = run_as(lab, host, "ip route; ip -6 route show default")
            assert routes.splitlines() == [f"{SUBNET}.0/24 dev eth0 proto kernel scope link src {host.addr} "], routes

    def test_extra_netns_service_is_reachable_from_hosts(self, lab: Lab, hosts: list[Host]) -> None:
        proc = lab.run_in_netns(
            [sys.executable, "-m", "http.server", "--bind", f"{SUBNET}.2", "8080"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(REPO_ROOT),
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            rc, out, _ = run_as(lab, hosts[2], f"curl -fsS http://{SUBNET}.2:8080/pyproject.toml")
            if rc == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert rc == 0 and "llmgw-pulumi" in out
        assert proc.poll() is None

    def test_a_host_namespace_holds_only_its_own_root(self, lab: Lab, hosts: list[Host]) -> None:
        """Workaround 5: a host's mount namespace drops the other roots and the hosts dir; an extra process, all."""

        def lab_mounts(pid: int | str) -> list[tuple[str, str]]:
            found = []
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
                point, source = line.split()[4], line.split(" - ")[1].split()[1]
                if point.startswith(str(lab.workdir)) or re.fullmatch(rf"{PREFIX}(h\d+|base)", source):
                    found.append((point, source))
            return found

        roots = [(str(h.root), h.name) for h in hosts]
        assert sorted(p for p, _ in lab_mounts("self")) == sorted([str(lab.hosts_dir), *(p for p, _ in roots)])
        for h, own in zip(hosts, roots, strict=True):
            assert h.pid is not None and lab_mounts(h.pid) == [own]
        proc = lab.run_in_netns(["sleep", "60"], netns_suffix="mnt", addr_index=5)
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lab_mounts(proc.pid) == []

    def test_stopped_host_shows_its_upper_dir(self, lab: Lab, hosts: list[Host]) -> None:
        host = hosts[0]
        host.stop()
        assert not host.running
        assert host.read_file("/etc/lab-marker") == b"hello\n"
        assert host.read_file("/etc/os-release") is None  # only in the rootfs, not a change of this host
        host.start()
        assert host.running

    def test_reboot_keeps_files_and_changes_boot_id(self, lab: Lab, hosts: list[Host]) -> None:
        host = hosts[0]
        boot_id = run_as(lab, host, "cat /proc/sys/kernel/random/boot_id")[1].strip()
        host.reboot()
        assert run_as(lab, host, "sudo cat /etc/lab-marker")[1] == "hello\n"
        assert run_as(lab, host, "cat /proc/sys/kernel/random/boot_id")[1].strip() not in ("", boot_id)

    def test_reboot_from_inside_the_host_comes_back(self, lab: Lab, hosts: list[Host]) -> None:
        host = hosts[2]
        boot_id = run_as(lab, host, "cat /proc/sys/kernel/random/boot_id")[1].strip()
        nspawn_pid = host.pid
        run_as(lab, host, "sudo systemctl reboot")
        deadline = time.monotonic() + 20
        while host.pid in (nspawn_pid, None) and time.monotonic() < deadline:
            time.sleep(0.05)
        host.wait_for_ssh()
        assert host.running
        assert run_as(lab, host, "cat /proc/sys/kernel/random/boot_id")[1].strip() not in ("", boot_id)

    def test_regenerate_host_keys_changes_the_host_key(self, lab: Lab, hosts: list[Host]) -> None:
        host = hosts[1]
        with Ssh(lab, host) as ssh:
            before = ssh.host_key()
        with Ssh(lab, hosts[2]) as ssh:
            assert ssh.host_key() != before  # every host has its own keys
        host.regenerate_host_keys()
        with Ssh(lab, host) as ssh:
            after = ssh.host_key()
        assert after.get_name() == before.get_name()
        assert after != before

    def test_link_delay(self, lab: Lab, hosts: list[Host]) -> None:
        host = hosts[2]

        def connect_time() -> float:
            start = time.monotonic()
            with socket.create_connection((host.addr, 22), timeout=5):
                return time.monotonic() - start

        try:
            host.set_link_delay(50)
        except NetemUnavailable as exc:
            assert "netem" in str(exc)
            pytest.skip(f"no netem in this kernel: {exc}")
        try:
            assert connect_time() >= 0.095  # SYN out and SYN-ACK back: 50 ms each way
        finally:
            host.set_link_delay(0)
        assert connect_time() < 0.05

    def test_a_second_lab_coexists(self, lab: Lab, hosts: list[Host], tmp_path: Path) -> None:
        other = Lab(name="y", subnet="10.253.0", workdir=tmp_path / "y")
        other.setup()
        try:
            (h,) = other.boot(1)
            assert run_as(other, h, "hostname")[1].strip() == "node1"
            with pytest.raises(LabError, match="already on"):
                Lab(name="z", subnet=SUBNET, workdir=tmp_path / "z").setup()
        finally:
            other.teardown()
            Lab(name="z", subnet=SUBNET, workdir=tmp_path / "z").teardown()
        assert run_as(lab, hosts[0], "hostname")[1].strip() == "node1"

    def test_teardown_leaves_nothing(self, lab: Lab, hosts: list[Host]) -> None:
        start = time.monotonic()
        lab.teardown()
        elapsed = time.monotonic() - start
        assert leftovers(lab) == []
        assert not any(h.running for h in hosts)
        lab.teardown()  # idempotent
        assert elapsed < 15

    def test_setup_sweeps_a_killed_run(self, lab: Lab) -> None:
        """A SIGKILLed test process leaves running containers and a netns service; setup removes them."""
        script = textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            sys.path.insert(0, {str(REPO_ROOT)!r})
            from lab.hosts import Lab
            lab = Lab(name={NAME!r}, subnet={SUBNET!r}, workdir=Path({str(lab.workdir)!r}))
            lab.setup()
            lab.boot(2)
            lab.run_in_netns(["sleep", "600"])
            print("up", flush=True)
            time.sleep(600)
        """)
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "up"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert leftovers(lab) != []
        lab.setup()
        made_by_setup = f"mount {lab.hosts_dir}"  # exactly: a host root under it is a leftover
        assert [x for x in leftovers(lab) if not x.startswith("link lgxbr") and x != made_by_setup] == []
        lab.teardown()
        assert leftovers(lab) == []
