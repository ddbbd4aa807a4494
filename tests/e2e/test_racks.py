"""examples/racks on lab hosts: one project, one stack per rack, shared settings in project-level config, each
rack's nodes from its node list file (llmgw:inventory); both racks run at once against one backend."""

from __future__ import annotations

import csv
import io
import shutil
import threading
from pathlib import Path
from typing import Any

import yaml

from lab.stack import LabStack, engine_env
from tests.conftest import RELEASE, REPO, ssh, state_urns

EXAMPLE = REPO / "examples" / "racks"
RACKS = {"rack-a": ["gpu-a01", "gpu-a02"], "rack-b": ["gpu-b01"]}


def lab_project(work: Path, cluster: Any, addresses: dict[str, str]) -> Path:
    """A copy of examples/racks whose shared settings and node addresses are the lab's; everything else as shipped."""
    shutil.copytree(EXAMPLE, work)
    (work / ".venv").symlink_to(REPO / ".venv")
    project = yaml.safe_load((work / "Pulumi.yaml").read_text())
    lab_values = {"llmgw:pkiDir": str(cluster.pki_dir), "llmgw:servers": [cluster.control_plane.address],
                  "llmgw:agent": {"version": RELEASE, "releaseUrl": cluster.release_url,
                                  "signingKey": cluster.release_signing_key},
                  "llmgw:ssh": {"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 30}}
    assert set(project["config"]) == set(lab_values), "the example's shared settings changed: update the lab's"
    for key, value in lab_values.items():
        project["config"][key]["value"] = value
    (work / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    rack_a = work / "racks" / "rack-a.csv"
    rows = list(csv.reader(io.StringIO(rack_a.read_text())))
    for row in rows:
        if row and row[0] in addresses:
            row[1] = addresses[row[0]]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    rack_a.write_text(out.getvalue())
    rack_b = work / "racks" / "rack-b.yaml"
    nodes = yaml.safe_load(rack_b.read_text())
    rack_b.write_text(yaml.safe_dump([{**n, "address": addresses[n["id"]]} for n in nodes], sort_keys=False))
    return work


def at_once(*stacks: LabStack, verb: str = "up") -> list[Any]:
    """The same command on each stack at the same time, as CI jobs run them; their runs in order."""
    runs: list[Any] = [None] * len(stacks)

    def one(i: int) -> None:
        runs[i] = getattr(stacks[i], verb)()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(stacks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs


def test_racks_example_runs_one_stack_per_rack_with_shared_project_config_and_node_list_files(
        cluster, hosts, tmp_path):
    booted = hosts(3, hostnames=[*RACKS["rack-a"], *RACKS["rack-b"]])
    addresses = {h.hostname: h.addr for h in booted}
    work = lab_project(tmp_path / "racks", cluster, addresses)
    env = engine_env(cluster.engine_bin, tmp_path / "pulumi-home", tmp_path / "state")
    env["SSL_CERT_FILE"] = str(cluster.pki_dir / "ca.pem")
    rack_a, rack_b = (LabStack(work, name, env) for name in RACKS)

    # A rack's stack file holds its nodes only; the engine gives it the project's shared settings.
    for stack in (rack_a, rack_b):
        assert yaml.safe_load(stack.config_path.read_text())["config"] == {
            "llmgw:inventory": f"racks/{stack.name}.{'csv' if stack.name == 'rack-a' else 'yaml'}"}

    # A bad rack-b: gpu-a02 also in rack-a's file, a bad port; refused before anything happens, every problem at once.
    good_b = (work / "racks" / "rack-b.yaml").read_text()
    (work / "racks" / "rack-b.yaml").write_text(good_b + f"- id: gpu-a02\n  address: {addresses['gpu-b01']}\n  port: 2222\n"
                                                         f"- id: gpu-b09\n  address: 10.255.255.1\n  port: 0\n")
    refused = rack_b.up()
    assert not refused.ok
    assert "racks/rack-b.yaml line 3 (node gpu-a02): id: 'gpu-a02' is also a node of stack rack-a " \
           "(racks/rack-a.csv line 4)" in refused.output, refused.output
    assert "racks/rack-b.yaml line 6 (node gpu-b09): port: 0 is not a TCP port" in refused.output, refused.output
    assert state_urns(rack_b) == []
    rc, out = ssh(booted[2], cluster, "sudo test -e /etc/llmgw/agent.pem && echo present || echo absent")
    assert (rc, out.strip()) == (0, "absent")
    (work / "racks" / "rack-b.yaml").write_text(good_b)

    runs = at_once(rack_a, rack_b)
    assert all(r.ok for r in runs), "\n".join(r.output for r in runs)
    for stack in (rack_a, rack_b):
        assert stack.outputs()["nextSteps"]["nodeIds"] == RACKS[stack.name]
    # The control planes came from the project-level config alone: every node of both racks connected to them.
    assert cluster.control_plane.wait_for({*RACKS["rack-a"], *RACKS["rack-b"]}, timeout=30)
    for run in at_once(rack_a, rack_b, verb="preview"):
        assert run.ok and set(run.changes) == {"same"}, run.output

    runs = at_once(rack_a, rack_b, verb="destroy")
    assert all(r.ok for r in runs), "\n".join(r.output for r in runs)
    assert state_urns(rack_a) == state_urns(rack_b) == []
