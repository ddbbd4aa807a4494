"""One stack file, three machines: two operators with their own home directories and a CI runner share one stack
in PostgreSQL (tests/e2e/test_postgres_backend.py), the SSH key named as `~/.ssh/id_fleet` in each one's home. What
only tells a machine how to reach the nodes is no change: each previews none, and a no-op `up` restarts nothing; a
real change is still shown, and `--diff` of an update that changes nothing on a node shows no input it did not
change."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from lab.stack import LabStack, engine_env
from tests.conftest import REPO, ssh, stack_config
from tests.e2e.conftest import POSTGRES_STACK

AGENT_PID = "systemctl show -p MainPID --value llmgw-agent"


def machine(work: Path, cluster: Any, server: Any, key: Path, committed: Path | None = None, **extra: str) -> LabStack:
    """A machine running Pulumi: its own home directory holding the fleet's key as ~/.ssh/id_fleet, its own
    PULUMI_HOME, logged in to the PostgreSQL backend, and its own checkout (with the committed stack file)."""
    home = work / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy2(key, home / ".ssh" / "id_fleet")
    (home / ".ssh" / "id_fleet").chmod(0o600)
    env = engine_env(cluster.engine_bin, work / "pulumi-home", work / "no-file-backend")
    del env["PULUMI_BACKEND_URL"]
    env.update(server.client_env(), SSL_CERT_FILE=str(cluster.pki_dir / "ca.pem"), HOME=str(home), **extra)
    env.pop("SSH_AUTH_SOCK", None)
    subprocess.run(["pulumi", "login", server.url, "--non-interactive"], env=env, check=True, capture_output=True)
    if committed is not None:
        (work / "checkout" / "stacks").mkdir(parents=True)
        shutil.copy2(committed, work / "checkout" / "stacks" / committed.name)
    return LabStack(work / "checkout", POSTGRES_STACK, env, REPO)


def changed_properties(output: str) -> dict[str, set[str]]:
    """Per resource type, the properties `preview --diff` marks as changed (~), added (+) or removed (-)."""
    found: dict[str, set[str]] = {}
    kind = ""
    for line in output.splitlines():
        if line.strip() in ("Outputs:", "--outputs:--"):
            break  # the stack's outputs follow the resources
        resource = re.match(r"\s*[~+-]? ?pulumi-python:dynamic/llmgw:(\w+):", line)
        if resource:
            kind = resource.group(1)
            continue
        prop = re.match(r"\s*[~+-]\s+([\w.]+)\s*:", line)
        if prop and kind:
            found.setdefault(kind, set()).add(prop.group(1))
    return found


def test_two_operators_and_a_ci_runner_with_other_homes_see_no_change_and_a_real_change_is_still_one(
        cluster, hosts, postgres, tmp_path):
    nodes = hosts(2)
    config = stack_config(cluster, nodes)
    config["ssh"] = {**config["ssh"], "privateKeyPath": "~/.ssh/id_fleet"}
    alice = machine(tmp_path / "alice", cluster, postgres, cluster.ssh_key_path)
    alice.set_config(config)
    made = alice.up()
    assert made.ok, made.output
    pids = {h.hostname: ssh(h, cluster, AGENT_PID)[1].strip() for h in nodes}
    assert all(pid not in ("", "0") for pid in pids.values()), pids
    exported = alice.cli("stack", "export", "--stack", POSTGRES_STACK).stdout
    assert '"private_key_path": "~/.ssh/id_fleet"' in exported and str(tmp_path) not in exported

    bob = machine(tmp_path / "bob", cluster, postgres, cluster.ssh_key_path, committed=alice.config_path)
    runner = machine(tmp_path / "ci", cluster, postgres, cluster.ssh_key_path, committed=alice.config_path,
                     CI="true", GITHUB_ACTIONS="true")
    for who in (bob, runner):
        seen = who.preview(expect_no_changes=True)
        assert seen.ok and set(seen.changes) == {"same"}, seen.output
    again = bob.up()
    assert again.ok and set(again.changes) == {"same"}, again.output
    assert {h.hostname: ssh(h, cluster, AGENT_PID)[1].strip() for h in nodes} == pids  # nothing restarted

    # An update that changes nothing on a node (how long to wait for SSH): its --diff names that input alone.
    slower = {**config, "ssh": {**config["ssh"], "wait": 45}}
    runner.set_config(slower)
    waits = runner.preview(diff=True)
    assert waits.ok and waits.changes.get("update") == 4 * len(nodes), waits.output
    changed = changed_properties(waits.output)
    for kind in ("AgentInstall", "EngineCheck", "ClientCertificate"):
        assert changed[kind] == {"connection", "wait"}, (kind, changed, waits.output)
    # NodeIdentity is told the certificate ClientCertificate holds after its update: a preview cannot know it.
    assert changed["NodeIdentity"] == {"connection", "wait", "ca_pem", "cert_pem"}, (changed, waits.output)

    # A real change is still one, from any machine.
    moved = {**config, "servers": [cluster.control_plane.address, "cp2.example:7443"]}
    runner.set_config(moved)
    real = runner.preview(expect_no_changes=True, diff=True)
    assert not real.ok and real.changes.get("update") == len(nodes), real.output
    assert "cp2.example:7443" in real.output
    assert {h.hostname: ssh(h, cluster, AGENT_PID)[1].strip() for h in nodes} == pids
