"""The example programs under examples/, run with the `pulumi` CLI on lab hosts, and the VM tool they call.

- vm-command: a `pulumi_command.local.Command` boots a VM with `python -m lab.vmctl`
  and a `Node` onboards it; re-imaging and destroy are checked on the machine.
- own-program: nodes built in the program's own code with the public API.
"""

from __future__ import annotations

import json
import re
import time
from types import SimpleNamespace

from tests.conftest import shard, ssh, stack_config
from tests.e2e.vm_examples import (
    EXAMPLES,
    NODE_RESOURCES,
    assert_destroy_cleans_the_node_then_stops_the_vm,
    assert_the_old_machine_was_left_clean,
    banner,
    host_keys,
    nspawn_running,
    preview_inputs,
    reimage_replaces_the_node,
    serial_on,
    step_ops,
    stops,
    vm_command_config,
    vm_index,
    vmctl,
)

# --------------------------------------------------------------------------- the VM tool


def test_vmctl_vms_outlive_the_tool_and_are_stopped_and_reimaged_from_other_processes(lab, cluster):
    index = vm_index()
    addr = lab.addr(index)
    try:
        booted = vmctl(lab, "boot", index, "--hostname", "vm-tool", "--image", "img-1")
        assert booted.returncode == 0, booted.stderr
        assert json.loads(booted.stdout) == {"address": addr, "hostname": "vm-tool", "index": index, "image": "img-1"}
        # The tool has exited; the VM runs on and answers SSH as the hostname it was given.
        assert banner(addr).startswith(b"SSH-")
        assert ssh(SimpleNamespace(addr=addr), cluster, "hostname")[1].strip() == "vm-tool"
        first = host_keys(addr, cluster)
        ssh(SimpleNamespace(addr=addr), cluster, "sudo touch /etc/written-by-first-image")

        again = vmctl(lab, "boot", index, "--hostname", "vm-tool", "--image", "img-1")
        assert again.returncode == 0, again.stderr
        assert host_keys(addr, cluster) == first, "booting a running VM with its own image changed it"

        # Another image: same address, a fresh disk.
        other = vmctl(lab, "boot", index, "--hostname", "vm-tool", "--image", "img-2")
        assert other.returncode == 0, other.stderr
        assert json.loads(other.stdout)["address"] == addr
        second = host_keys(addr, cluster)
        assert second and not second & first
        assert ssh(SimpleNamespace(addr=addr), cluster, "test -e /etc/written-by-first-image; echo $?")[1].strip() == "1"

        reimaged = vmctl(lab, "reimage", index, "--hostname", "vm-tool")
        assert reimaged.returncode == 0, reimaged.stderr
        assert json.loads(reimaged.stdout)["image"] == "img-2"
        third = host_keys(addr, cluster)
        assert third and not third & (first | second)

        before = len(stops(lab, index))
        stopped = vmctl(lab, "stop", index)
        assert stopped.returncode == 0, stopped.stderr
        assert not nspawn_running(lab, index)
        assert banner(addr) == b""
        assert stops(lab, index)[before:] == [
            {**stops(lab, index)[-1], "running": True, "etc_llmgw": None,
             "paths": {"/etc/llmgw": False, "/usr/local/bin/llmgw": False, "/etc/systemd/system/llmgw-agent.service": False}}
        ]
    finally:
        vmctl(lab, "stop", index)


# --------------------------------------------------------------------------- examples/vm-command


def test_vm_command_example_boots_onboards_reimages_and_destroys_in_order(lab, cluster, new_stack):
    index = vm_index()
    addr = lab.addr(index)
    stack = new_stack(vm_command_config(lab, cluster, index, "debian-12-r1"), project=EXAMPLES / "vm-command")
    try:
        # Preview: the VM is not booted, its address unknown, the node's resources to create.
        preview = stack.preview(diff=True)
        assert preview.ok, preview.output
        assert not nspawn_running(lab, index)
        node_ops = {k: v for k, v in step_ops(preview).items() if "llmgw" in k.split("::")[0]}
        assert node_ops == {k: "create" for k in NODE_RESOURCES}, preview.output
        assert step_ops(preview)["command:local:Command::vm"] == "create"
        assert preview_inputs(preview, "NodeIdentity")["connection"]["host"] == "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
        assert re.search(r"^\s+address\s*: \[unknown\]$", preview.output, re.M), preview.output

        # One up boots the VM and onboards it.
        up = stack.up()
        assert up.ok, up.output
        out = stack.outputs()
        assert out["address"] == addr
        assert cluster.control_plane.wait_for({"gpu-vm1"}, timeout=15)
        first_keys = host_keys(addr, cluster)
        assert out["host_key"] in first_keys
        assert serial_on(addr, cluster) == out["certificate_serial"]
        assert stack.preview(expect_no_changes=True).ok

        # Re-image: the trigger changes, the VM is replaced (same address, new disk, new host keys),
        # and the same up replaces the node's resources with it.
        since = time.time()
        reimage, new_keys = reimage_replaces_the_node(stack, lab, cluster, index, first_keys)
        assert reimage.changes == {"replace": 6, "same": 2}, reimage.changes  # + the stack and the shard's provider
        again = stack.outputs()
        assert again["address"] == addr
        assert again["host_key"] in new_keys, "state does not hold the new machine's host key"
        assert again["certificate_serial"] != out["certificate_serial"], "no fresh certificate for the new machine"
        assert serial_on(addr, cluster) == again["certificate_serial"]
        assert cluster.control_plane.wait_for_event(
            lambda e: e.node_id == "gpu-vm1" and e.outcome == "accepted" and e.time > since, timeout=15)
        # The old machine was left clean before it went down.
        # (The boot of the new image stops a VM that is already off; only one stop found it running.
        # The engine deletes a VM's replace_with dependents in no fixed order, so an emptied /etc/llmgw may remain.)
        assert_the_old_machine_was_left_clean(lab, index, since)

        # Destroy: the node's files are gone while the VM still runs, then the VM stops.
        assert_destroy_cleans_the_node_then_stops_the_vm(stack, lab, index, addr)
    finally:
        vmctl(lab, "stop", index)


# --------------------------------------------------------------------------- examples/own-program


def test_own_program_example_onboards_nodes_built_in_its_code_each_in_its_shard(cluster, hosts, new_stack):
    a, b = hosts(2, hostnames=["gpu-a", "gpu-b"])
    base = stack_config(cluster, [], nodes=[])
    config = {"addresses": {"gpu-a": a.addr, "gpu-b": b.addr},
              **{k: base[k] for k in ("pkiDir", "servers", "agent", "ssh")}}
    stack = new_stack(config, project=EXAMPLES / "own-program")
    up = stack.up()
    assert up.ok, up.output
    assert cluster.control_plane.wait_for({"gpu-a", "gpu-b"}, timeout=15)
    assert "ib-east" in b.read_file("/etc/llmgw/agent.yaml").decode()  # a setting computed in the program
    assert "fabrics" not in a.read_file("/etc/llmgw/agent.yaml").decode()

    # Each node's four resources run in its own shard's provider process, named as program.main names them.
    resources = stack.export()["resources"]
    for node in ("gpu-a", "gpu-b"):
        providers = {r["provider"].split("::")[3] for r in resources
                     if r["type"].startswith("pulumi-python:dynamic/llmgw:") and r["urn"].endswith(f"::{node}")}
        assert providers == {f"llmgw-shard-{shard(node)}"}, (node, providers)
    shard_urns = [r["urn"] for r in resources if r["type"] == "pulumi:providers:pulumi-python"]
    assert sorted(u.split("::")[-1] for u in shard_urns) == sorted({f"llmgw-shard-{shard(n)}" for n in ("gpu-a", "gpu-b")})
    assert all("$" not in u.split("::")[2] for u in shard_urns), shard_urns  # top-level: the URNs program.main made

    destroy = stack.destroy()
    assert destroy.ok, destroy.output
    for h in (a, b):
        assert h.read_file("/etc/llmgw/agent.pem") is None
        assert h.read_file("/usr/local/bin/llmgw") is None
