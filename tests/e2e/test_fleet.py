"""What real fleets need (issue 10): ssh-agent, protected keys, late login users and cloud-init, operator-side
settings that are not node changes, outages that change nothing, drift in modes and owners, standing problems."""

import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmgw_pulumi.stack.shards import SHARDS_ENV
from tests.conftest import SPREAD, said, shard, ssh, stack_config, up_when, wait_until

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

KEY = "/etc/llmgw/agent-key.pem"
CONFIG = "/etc/llmgw/agent.yaml"


def add_sudo_user(host, cluster, user: str) -> None:
    """A login user like deploy: the lab key, passwordless sudo."""
    pub = ssh(host, cluster, "cat ~/.ssh/authorized_keys")[1].strip()
    rc, out = ssh(host, cluster, f"sudo useradd -m -s /bin/sh {user} && "
                                 f"echo '{user} ALL=(ALL) NOPASSWD:ALL' | sudo tee /etc/sudoers.d/{user} && "
                                 f"sudo install -d -o {user} -m 700 ~{user}/.ssh && "
                                 f"echo '{pub}' | sudo install -o {user} -m 600 /dev/stdin ~{user}/.ssh/authorized_keys")
    assert rc == 0, out


def main_pid(host, cluster) -> str:
    return ssh(host, cluster, "systemctl show -p MainPID --value llmgw-agent")[1].strip()


def onboarded(cluster, hosts, new_stack, **top):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], **top)
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output
    return h, config, stack


@pytest.fixture
def ssh_agent(tmp_path):
    """A real ssh-agent on a socket of this test; yields its SSH_AUTH_SOCK."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(sock.exists, 10), "ssh-agent did not start"
        yield str(sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def protected_copy(key: Path, to: Path, passphrase: str) -> Path:
    shutil.copy(key, to)
    to.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", passphrase, "-f", str(to)], check=True)
    return to


# --------------------------------------------------------------------------- authentication


def test_onboards_with_the_key_only_in_ssh_agent(cluster, hosts, new_stack, ssh_agent, tmp_path):
    key = protected_copy(cluster.ssh_key_path, tmp_path / "id_agent", "agent-only")
    add = subprocess.run(["ssh-add", str(key)], env={**os.environ, "SSH_AUTH_SOCK": ssh_agent},
                         input="agent-only\n", capture_output=True, text=True)
    # ssh-add reads a passphrase from a terminal, or SSH_ASKPASS: give it one.
    if add.returncode != 0:
        askpass = tmp_path / "askpass"
        askpass.write_text("#!/bin/sh\necho agent-only\n")
        askpass.chmod(0o700)
        add = subprocess.run(["ssh-add", str(key)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             env={**os.environ, "SSH_AUTH_SOCK": ssh_agent, "SSH_ASKPASS": str(askpass),
                                  "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"})
    assert add.returncode == 0, add.stderr
    key.unlink()  # only the agent has it now

    (h,) = hosts(1)
    config = stack_config(cluster, [h], ssh={"user": "deploy", "wait": 30})  # no key configured at all
    stack = new_stack(config)
    stack.env["SSH_AUTH_SOCK"] = ssh_agent
    up = stack.up()
    assert up.ok, up.output
    assert ssh(h, cluster, "systemctl is-active llmgw-agent")[1].strip() == "active"
    assert cluster.control_plane.wait_for({h.hostname}, timeout=15)

    # Without the agent, the error says there is no key to log in with, naming the setting.
    stack.env.pop("SSH_AUTH_SOCK")
    refresh = stack.refresh()
    assert "no SSH key is configured and no ssh-agent has one" in refresh.output, refresh.output


def test_a_passphrase_protected_key_with_its_passphrase_as_a_secret(cluster, hosts, new_stack, tmp_path):
    key = protected_copy(cluster.ssh_key_path, tmp_path / "id_protected", "correct horse")
    (h,) = hosts(1)
    config = stack_config(cluster, [h], ssh={"user": "deploy", "privateKeyPath": str(key), "wait": 30})
    stack = new_stack(config)

    missing = stack.up()
    assert not missing.ok
    assert "is protected by a passphrase, and none is configured" in missing.output, missing.output
    assert "llmgw:sshKeyPassphrase" in missing.output

    stack.config_set("llmgw:sshKeyPassphrase", "wrong", secret=True)
    wrong = stack.up()
    assert not wrong.ok
    assert "cannot be decrypted with the configured passphrase" in wrong.output, wrong.output
    assert h.read_file(KEY) is None, "something reached the node before the key was usable"

    stack.config_set("llmgw:sshKeyPassphrase", "correct horse", secret=True)
    up = stack.up()
    assert up.ok, up.output
    assert "correct horse" not in stack.all_output() and "correct horse" not in stack.export_raw()
    assert cluster.control_plane.wait_for({h.hostname}, timeout=15)


@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_rsa_and_ecdsa_operator_keys_log_in(cluster, hosts, new_stack, tmp_path, kind):
    (h,) = hosts(1)
    key = tmp_path / f"id_{kind}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(key)], check=True)
    assert ssh(h, cluster, f"echo '{key.with_suffix('.pub').read_text().strip()}' >> ~/.ssh/authorized_keys")[0] == 0
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(key)], capture_output=True, text=True, check=True).stdout.split()[1]
    up = new_stack(stack_config(cluster, [h], ssh={"user": "deploy", "privateKeyPath": str(key), "wait": 30})).up()
    assert up.ok, up.output
    rc, log = ssh(h, cluster, "sudo journalctl -u ssh --no-pager -o cat | grep 'Accepted publickey for deploy'")
    assert f"{kind.upper()} {fingerprint}" in log, log  # sshd accepted this key, not the lab's ed25519 one


# --------------------------------------------------------------------------- readiness


def test_a_login_user_made_10s_after_sshd_starts_is_waited_for(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], ssh={"user": "late", "privateKeyPath": str(cluster.ssh_key_path), "wait": 60})
    # The user is made once the up waits for it (its first login refused), and no sooner than 10 s into the up.
    up = up_when(new_stack(config), lambda events, seconds: seconds >= 10 and said(events, "waiting up to 60s for ssh to late@"),
                 add_sudo_user, h, cluster, "late")
    assert up.ok, up.output
    assert up.seconds >= 10
    assert "waiting up to 60s for ssh to late@" in up.output and "refused every key tried" in up.output, up.output
    assert cluster.control_plane.wait_for({h.hostname}, timeout=15)


def test_without_the_user_the_wait_ends_with_the_specs_message_and_the_last_reason(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], ssh={"user": "nobody-here", "privateKeyPath": str(cluster.ssh_key_path), "wait": 5})
    up = new_stack(config).up()
    assert not up.ok
    assert f"cannot reach nobody-here@{h.addr} over ssh after 5s (last error:" in up.output, up.output
    assert "refused every key tried: key " in up.output


CLOUD_INIT = """#!/bin/sh
# A stand-in for cloud-init: `status --wait` blocks until the test says first boot is over; then, as cloud-init
# does, the host has new SSH host keys and a restarted sshd.
[ "$1" = status ] || exit 3
if [ "$2" != --wait ]; then
  if [ -e /run/cloud-init-test-done ]; then echo "status: done"; else echo "status: running"; fi
  exit 0
fi
touch /var/tmp/cloud-init-test-waited  # the test ends first boot once it is waited for
while [ ! -e /run/cloud-init-test-done ]; do sleep 0.2; done
echo "status: done"
"""


def test_cloud_init_is_waited_for_and_the_key_recorded_is_the_one_it_leaves(cluster, hosts, new_stack):
    (h,) = hosts(1, start=False)
    stand_in = h.upper / "usr" / "bin" / "cloud-init"
    stand_in.parent.mkdir(parents=True, exist_ok=True)
    stand_in.write_text(CLOUD_INIT)
    stand_in.chmod(0o755)
    h.start()

    def first_boot_ends() -> None:
        ssh(h, cluster, "sudo sh -c 'rm -f /etc/ssh/ssh_host_*; ssh-keygen -A -q; touch /run/cloud-init-test-done; "
                        "systemctl restart ssh'")

    config = stack_config(cluster, [h], ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 60})
    stack = new_stack(config)
    # First boot ends once the up waits for it, and no sooner than 8 s into the up.
    up = up_when(stack, lambda _, seconds: seconds >= 8 and h.read_file("/var/tmp/cloud-init-test-waited") is not None,
                 first_boot_ends)
    assert up.ok, up.output
    assert up.seconds >= 8
    assert "waited for cloud-init" in up.output, up.output
    recorded = [r for r in stack.export()["resources"] if r["type"].endswith("NodeIdentity")][0]["outputs"]["host_key"]
    final = h.read_file(f"/etc/ssh/ssh_host_{recorded.split()[0].removeprefix('ssh-').split('-')[0]}_key.pub").decode()
    assert recorded.split()[1] == final.split()[1], "the key recorded is not the one the host kept"
    assert stack.preview(expect_no_changes=True).ok


# --------------------------------------------------------------------------- operator-side settings


def test_operator_side_settings_change_nothing_on_the_node(cluster, hosts, new_stack, tmp_path):
    h, config, stack = onboarded(cluster, hosts, new_stack)
    # A second login user with the same rights, a copy of the key elsewhere, a protected copy.
    add_sudo_user(h, cluster, "ops")
    moved = tmp_path / "moved_key"
    shutil.copy(cluster.ssh_key_path, moved)
    moved.chmod(0o600)
    protected = protected_copy(cluster.ssh_key_path, tmp_path / "protected_key", "pass one")

    ssh_settings = config["ssh"]
    changes = [
        ("ssh.wait", {**ssh_settings, "wait": 45}, None),
        ("ssh.user", {**ssh_settings, "user": "ops"}, None),
        ("ssh.privateKeyPath", {**ssh_settings, "user": "ops", "privateKeyPath": str(moved)}, None),
        ("the key and its passphrase", {**ssh_settings, "user": "ops", "privateKeyPath": str(protected)}, "pass one"),
    ]
    pid = main_pid(h, cluster)
    for what, ssh_now, passphrase in changes:
        stack.set_config({**config, "ssh": ssh_now})
        if passphrase:
            stack.config_set("llmgw:sshKeyPassphrase", passphrase, secret=True)
        opens = h.passive_tcp_opens()
        up = stack.up()
        accepted = h.passive_tcp_opens() - opens
        assert up.ok, (what, up.output)
        assert accepted == 0, f"changing {what} made {accepted} SSH connections"
        assert main_pid(h, cluster) == pid, f"changing {what} restarted the agent"
    # ... and the new settings are the ones used from now on: a refresh logs in as ops with the protected key.
    rc, auth_log = ssh(h, cluster, "sudo journalctl -u ssh --no-pager -o cat | grep -c 'Accepted publickey for ops' || true")
    before = int(auth_log.strip() or 0)
    assert stack.refresh().ok
    rc, auth_log = ssh(h, cluster, "sudo journalctl -u ssh --no-pager -o cat | grep -c 'Accepted publickey for ops' || true")
    assert int(auth_log.strip() or 0) > before


# --------------------------------------------------------------------------- outages


def test_a_refresh_during_an_outage_keeps_state_and_the_next_up_does_nothing(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 10})
    stack = new_stack(config)
    assert stack.up().ok
    before = [(r["urn"], r.get("inputs"), r.get("outputs")) for r in stack.export()["resources"]]
    h.stop()
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    assert f"{h.hostname}: cannot reach deploy@{h.addr}" in refresh.output, refresh.output
    assert "kept as it was" in refresh.output
    after = [(r["urn"], r.get("inputs"), r.get("outputs")) for r in stack.export()["resources"]]
    assert after == before, "a refresh during an outage changed the state"

    h.start()
    pid = main_pid(h, cluster)
    up = stack.up()
    assert up.ok, up.output
    assert set(up.changes) == {"same"}, up.changes
    assert main_pid(h, cluster) == pid


# --------------------------------------------------------------------------- drift in modes and owners


def test_modes_and_owners_drift_is_seen_by_refresh_and_repaired_by_up(cluster, hosts, new_stack):
    h, config, stack = onboarded(cluster, hosts, new_stack)
    assert ssh(h, cluster, f"sudo chmod 0644 {KEY} && sudo chown nobody {CONFIG} && "
                           "echo 'mgmt_addr: 192.0.2.7' | sudo tee -a /etc/llmgw/agent.yaml")[0] == 0
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    preview = stack.preview(diff=True)
    assert preview.ok, preview.output
    assert '- mgmt_addr: "192.0.2.7"' in preview.output, preview.output  # the line on the node, shown going away
    assert "0644" in preview.output and KEY in preview.output, preview.output
    assert "nobody" in preview.output and CONFIG in preview.output, preview.output

    up = stack.up()
    assert up.ok, up.output
    key, conf = h.stat(KEY), h.stat(CONFIG)
    assert (key.st_mode & 0o777, key.st_uid) == (0o600, 0)
    assert (conf.st_mode & 0o777, conf.st_uid) == (0o644, 0)
    assert b"192.0.2.7" not in h.read_file(CONFIG)
    assert stack.preview(expect_no_changes=True).ok


# --------------------------------------------------------------------------- standing problems


def test_a_standing_engine_problem_is_a_warning_not_a_change(cluster, hosts, new_stack):
    (h,) = hosts(1)
    engines = {"vllm": {"bin": "/opt/vllm/bin/vllm"}}  # not there
    config = stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr, "engines": engines}])
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output
    assert "/opt/vllm/bin/vllm" in preview.output and "warning:" in preview.output, preview.output
    again = stack.up()
    assert set(again.changes) == {"same"}, again.changes
    assert "/opt/vllm/bin/vllm" in again.output


# --------------------------------------------------------------------------- jump hosts


@pytest.fixture
def private_control_plane(lab, cluster):
    """A control plane on the private segment, where nodes behind the bastion can reach it."""
    from lab.control_plane import ControlPlane

    cp = ControlPlane(cluster.pki_dir, f"{lab.private_subnet}.3", netns=lab.add_netns("cp", 3, segment="private")).start()
    yield cp
    cp.stop()


def unreachable_directly(host) -> bool:
    try:
        socket.create_connection((host.addr, 22), timeout=3).close()
    except OSError:
        return True
    return False


AGENT_PID = "systemctl show -p MainPID --value llmgw-agent"


def ssh_through(bastion, host, cluster, command: str) -> str:
    """Run a command on a host behind the bastion over SSH (as deploy, through the bastion); its output."""
    import paramiko

    def client(**connect: Any) -> paramiko.SSHClient:
        c = paramiko.SSHClient()
        c.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        c.connect(username="deploy", key_filename=str(cluster.ssh_key_path), timeout=10, allow_agent=False,
                  look_for_keys=False, **connect)
        return c

    jump = client(hostname=bastion.addr)
    try:
        transport = jump.get_transport()
        assert transport is not None
        channel = transport.open_channel("direct-tcpip", (host.addr, 22), ("127.0.0.1", 0))
        node = client(hostname=host.addr, sock=channel)
        try:
            _, out, err = node.exec_command(command, timeout=60)
            rc = out.channel.recv_exit_status()
            text = out.read().decode() + err.read().decode()
            assert rc == 0, f"{host.hostname}: {command}: {text}"
            return text.strip()
        finally:
            node.close()
    finally:
        jump.close()


def two_by_two() -> list[str]:
    """Four host names, two in each of two provider shards (tests/conftest.py ``shard``): each of the two provider
    processes then has two nodes behind the bastion. Named here, not taken from the lab's host indices, which
    depend on the worker and the tests before."""
    by_shard: dict[int, list[str]] = {}
    for name in (f"behind-{i}" for i in range(100)):
        by_shard.setdefault(shard(name, SPREAD), []).append(name)
    first, second = list(by_shard.values())[:2]
    return first[:2] + second[:2]


def test_nodes_behind_one_bastion_are_onboarded_through_it(cluster, hosts, new_stack, private_control_plane):
    (bastion,) = hosts(1, segment="both")
    # More nodes than provider processes: the bastion carries each process's nodes on that process's one connection.
    nodes = hosts(4, hostnames=two_by_two(), segment="private")
    assert len({shard(h.hostname, SPREAD) for h in nodes}) == 2 and len(nodes) == 4
    assert all(unreachable_directly(h) for h in nodes) and nodes
    config = stack_config(cluster, nodes, servers=[private_control_plane.address],
                          agent={"binary": str(cluster.dev_binary)},
                          ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 60,
                               "jump": f"deploy@{bastion.addr}"})
    stack = new_stack(config)
    stack.env[SHARDS_ENV] = str(SPREAD)  # two provider processes, two nodes each
    opens = {h.hostname: h.passive_tcp_opens() for h in (bastion, *nodes)}
    up = stack.up()
    accepted = {h.hostname: h.passive_tcp_opens() - opens[h.hostname] for h in (bastion, *nodes)}
    assert up.ok, up.output
    assert private_control_plane.wait_for({h.hostname for h in nodes}, timeout=30), private_control_plane.events[-5:]
    # One connection per node (its four resources share it), and the bastion carries them all on one connection
    # per provider process that has nodes behind it.
    processes = len({shard(h.hostname, SPREAD) for h in nodes})
    assert [accepted[h.hostname] for h in nodes] == [1] * len(nodes), accepted
    assert 1 <= accepted[bastion.hostname] <= processes, (accepted, processes)
    facts = {"bastion_accepted": accepted[bastion.hostname], "provider_processes": processes,
             "nodes_accepted": sum(accepted[h.hostname] for h in nodes), "up_s": round(up.seconds, 1)}
    print(f"\nREPORT bastion-4-nodes: {json.dumps(facts)}")

    identity = next(r for r in stack.export()["resources"] if r["type"].endswith("NodeIdentity"))
    recorded = identity["outputs"]["jump_host_keys"][f"{bastion.addr}:22"]
    assert recorded.split()[1] in bastion.read_file(f"/etc/ssh/ssh_host_{recorded.split()[0][4:]}_key.pub").decode()
    assert stack.preview(expect_no_changes=True).ok

    # The jump host given another way (a list, with its key pinned): an operator-side setting, no node change.
    stack.set_config({**config, "ssh": {**config["ssh"], "jump": [{"address": f"deploy@{bastion.addr}", "hostKey": recorded}]}})
    pids = {h.hostname: ssh_through(bastion, h, cluster, AGENT_PID) for h in nodes}
    opens = {h.hostname: h.passive_tcp_opens() for h in (bastion, *nodes)}
    streams = len(private_control_plane.events)
    again = stack.up()
    assert again.ok, again.output
    assert {h.hostname: h.passive_tcp_opens() - opens[h.hostname] for h in (bastion, *nodes)} == \
        {h.hostname: 0 for h in (bastion, *nodes)}
    assert again.changes.get("update", 0) >= 3 * len(nodes), again.changes  # recorded in state, nothing else
    assert {h.hostname: ssh_through(bastion, h, cluster, AGENT_PID) for h in nodes} == pids, "an agent was restarted"
    # The control plane saw no stream end: one agent restarted now, on purpose, is seen closing and reconnecting,
    # and had the up restarted another, its close would be in the list before these.
    ssh_through(bastion, nodes[0], cluster, "sudo systemctl restart llmgw-agent")
    assert private_control_plane.wait_for_event(
        lambda e: e.node_id == nodes[0].hostname and e.outcome == "accepted"
        and private_control_plane.events.index(e) >= streams, timeout=30)
    assert sorted((e.node_id, e.outcome) for e in private_control_plane.events[streams:]) == \
        [(nodes[0].hostname, "accepted"), (nodes[0].hostname, "closed")], "an agent reconnected during the up"

    # A bastion that comes back with other host keys is refused like a node would be.
    bastion.regenerate_host_keys()
    refused = stack.refresh()
    assert not refused.ok
    assert f"{bastion.addr} presented host key" in refused.output and "refusing" in refused.output, refused.output


# --------------------------------------------------------------------------- a failed run on one screen


def stack_section(output: str, stack: str) -> list[str]:
    """The lines the CLI prints under the stack's own diagnostics (``pulumi:pulumi:Stack (llmgw-<stack>):``), up
    to the next section. (The CLI orders the Diagnostics' sections as a Go map, so the stack's is not always last.)"""
    lines = output.splitlines()
    start = max(i for i, line in enumerate(lines) if line.strip() == f"pulumi:pulumi:Stack (llmgw-{stack}):")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].strip() or lines[i].startswith("Resources:"))
    return [line.strip() for line in lines[start + 1:end]]


def test_a_failed_fleet_run_lists_the_failed_nodes_and_their_reasons_once(cluster, hosts, new_stack):
    down = hosts(2, start=False)  # prepared, never booted: nothing answers at their addresses
    up_hosts = hosts(10)
    # The unreachable nodes first: their steps start before the first failure stops the engine starting others.
    config = stack_config(cluster, [*down, *up_hosts],
                          ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 5})
    stack = new_stack(config)
    up = stack.up()
    assert not up.ok
    # Neither the providers' nor the program's frames: the engine interrupts the program when a node fails.
    assert "Traceback" not in up.output and "KeyboardInterrupt" not in up.output, up.output
    # The stack's diagnostics: one line per failed node, the first line of its reason and its fix, each once.
    failed = [line for line in stack_section(up.output, stack.name) if " failed: " in line]
    assert sorted(line.removeprefix("error: ").split(" failed: ")[0] for line in failed) == \
        sorted(h.hostname for h in down), up.output
    for h in down:
        (line,) = [line for line in failed if line.startswith(f"error: {h.hostname} failed: ")]
        assert f"cannot reach deploy@{h.addr} over ssh after 5s" in line and "(fix: check the address" in line, line
    summary = up.output[up.output.index("\nDiagnostics:"):]
    assert all(summary.count(line) == 1 for line in failed), summary
