"""Tests of the light host form (lab/light.py; docs/test-hosts.md, "Light hosts"), which only the benchmark uses.

Two light hosts boot in a lab of their own, named after this test process's lab (LLMGW_TEST_LAB) with an "l" in
front and on its subnet's third octet + 64, so it never sweeps the session's lab: their sshd answers, root's
systemctl installs and starts a unit as the node scripts do, D-Bus and logind are not running, and every process
of a host has the KSM merge flag and ASLR off; ksmd runs while the lab does and merges pages of the two hosts.
The pure tests run anywhere.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from lab import light
from lab.hosts import Host, Lab, LabError
from tests.conftest import lab_name_and_subnet

needs_hosts = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                                 reason="needs root and systemd-nspawn")

UNIT = """\
[Unit]
Description=light host probe

[Service]
ExecStart=/bin/sleep infinity
"""


# --------------------------------------------------------------------------- pure tests


def test_ksm_stat_is_parsed() -> None:
    text = "ksm_rmap_items 2436\nksm_zero_pages 0\nksm_merging_pages 1319\nksm_process_profit 5246720\n" \
           "ksm_merge_any: yes\nksm_mergeable: yes\n"
    stat = light.parse_ksm_stat(text)
    assert stat["ksm_merge_any"] == "yes" and stat["ksm_rmap_items"] == "2436"
    # 1319 merged pages of 4 KiB less the profit: 2436 rmap items of 64 bytes.
    assert light.ksm_metadata_bytes(stat) == 2436 * 64
    assert light.ksm_metadata_bytes({}) == 0


def test_stat_cpu_seconds_counts_from_the_name_s_closing_parenthesis() -> None:
    tck = os.sysconf("SC_CLK_TCK")
    line = f"42 (odd ) name) S 2 0 0 0 -1 2129984 0 0 0 0 {3 * tck} {2 * tck} 0 0 20 0 1 0 100 0 0"
    assert light.stat_cpu_seconds(line) == 5.0


# --------------------------------------------------------------------------- light hosts


def light_lab_name_and_subnet(worker: str) -> tuple[str, str]:
    """This process's lab name with an "l" in front (at most 3 letters), its subnet's third octet + 64."""
    name, subnet = lab_name_and_subnet(worker)
    first, second, third = subnet.split(".")
    return f"l{name[-2:]}", f"{first}.{second}.{(int(third) + 64) % 256}"


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    worker = getattr(request.config, "workerinput", {}).get("workerid", "")
    name, subnet = light_lab_name_and_subnet(worker)
    with Lab(name=name, subnet=subnet, workdir=tmp_path_factory.mktemp("light"), light=True) as lab:
        yield lab


@pytest.fixture(scope="module")
def hosts(lab: Lab) -> list[Host]:
    return lab.boot(2)


def run(lab: Lab, host: Host, command: str, stdin: str | None = None) -> tuple[int, str]:
    """`command` as deploy over SSH (paramiko, the lab key): its exit status and output."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    key = paramiko.Ed25519Key.from_private_key_file(str(lab.ssh_key_path))
    client.connect(host.addr, username="deploy", pkey=key, look_for_keys=False, allow_agent=False, timeout=10)
    try:
        chan_in, out, _ = client.exec_command(command, timeout=60)
        if stdin is not None:
            chan_in.write(stdin)
            chan_in.channel.shutdown_write()
        text = out.read().decode()
        return out.channel.recv_exit_status(), text
    finally:
        client.close()


def processes(host: Host) -> dict[int, str]:
    """pid -> name of every process in the host's cgroup that still lives (an SSH session's may just have ended)."""
    cgroup = host.cgroups[0]
    found: dict[int, str] = {}
    for d in [cgroup, *(p for p in cgroup.rglob("*") if p.is_dir())]:
        for pid in (d / "cgroup.procs").read_text().split():
            try:
                found[int(pid)] = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
    return found


@pytest.mark.hosts
@needs_hosts
class TestLightHosts:
    def test_sshd_answers_and_root_s_systemctl_runs_a_unit(self, lab: Lab, hosts: list[Host]) -> None:
        for host in hosts:
            script = ("sudo -n tee /etc/systemd/system/light-probe.service >/dev/null && sudo -n systemctl daemon-reload"
                      " && sudo -n systemctl enable --now light-probe.service >/dev/null 2>&1"
                      " && sudo -n systemctl is-active light-probe.service && hostname")
            rc, out = run(lab, host, script, stdin=UNIT)
            assert (rc, out.split()) == (0, ["active", host.hostname])
            assert "sleep" in processes(host).values()

    def test_no_dbus_or_logind_runs(self, lab: Lab, hosts: list[Host]) -> None:
        for host in hosts:
            _, out = run(lab, host, "sudo -n systemctl is-active dbus.service systemd-logind.service ssh.service")
            assert out.split() == ["inactive", "inactive", "active"]
            names = set(processes(host).values())
            assert "sshd" in names and "systemd" in names
            assert not names & {"dbus-daemon", "systemd-logind"}

    def test_every_process_has_the_merge_flag_and_no_aslr(self, lab: Lab, hosts: list[Host]) -> None:
        own = light.ksm_stat(os.getpid())
        assert own["ksm_merge_any"] == "no"  # the control: this process was not marked
        for host in hosts:
            procs = processes(host)
            assert {"systemd-nspawn", "systemd", "sshd", "systemd-journal"} <= set(procs.values())
            for pid, name in procs.items():
                try:
                    merge_any = light.ksm_stat(pid)["ksm_merge_any"]
                    persona = int(Path(f"/proc/{pid}/personality").read_text(), 16)
                except (KeyError, OSError):
                    continue  # ended meanwhile
                assert merge_any == "yes", name
                assert persona & light.ADDR_NO_RANDOMIZE, (name, hex(persona))
        assert int(Path("/proc/self/personality").read_text(), 16) & light.ADDR_NO_RANDOMIZE == 0

    def test_the_services_start_with_the_hash_seed(self, lab: Lab, hosts: list[Host]) -> None:
        rc, out = run(lab, hosts[0], "sudo -n systemctl show-environment")
        assert rc == 0 and "PYTHONHASHSEED=0" in out.split()

    def test_ksmd_runs_and_merges_the_hosts_pages(self, lab: Lab, hosts: list[Host]) -> None:
        assert (light.KSM / "run").read_text().strip() == "1"
        deadline = time.monotonic() + 120
        merged = 0
        while time.monotonic() < deadline and merged == 0:
            merged = sum(int(light.ksm_stat(pid).get("ksm_merging_pages", "0")) for pid in processes(hosts[1]))
            time.sleep(1)
        assert merged > 0
        assert light.ksmd_cpu_seconds() > 0

    def test_the_form_does_not_switch_while_hosts_run(self, lab: Lab, hosts: list[Host]) -> None:
        with pytest.raises(LabError, match="while hosts run"):
            lab.set_light(False)
        assert lab.light


def test_the_memory_table_says_whether_1000_hosts_fit() -> None:
    from bench.light import memory_table

    rows = [{"size": 30, "form": form, "ok": True, "booted_mib": 10.0, "onboarded_mib": mib, "onboarded_max_mib": mib,
             "ksmd_cpu": 0.0, "ksmd_seconds": 100.0, "ksmd_idle_rate": 0.0, "merged_mib": 0.0, "capacity": capacity,
             "tasks": 5} for form, mib, capacity in (("default", 23.6, 797), ("light", 7.2, 1000))]
    lines = memory_table(rows).splitlines()
    assert lines[2].startswith("| 30 | default |") and lines[2].endswith("| 797 | do not fit |")
    assert lines[3].startswith("| 30 | light |") and lines[3].endswith("| 1,000 | fit |")
    assert "not measured" in memory_table([])
