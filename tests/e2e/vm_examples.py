"""Helpers for the tests of the VM examples (examples/vm-command, typescript-vm, go-vm): lab VMs booted with
`python -m lab.vmctl`, what a stack's runs did to them, and the checks every example's test makes (a re-image
replaces the VM and its node; destroy cleans the node, then stops the VM)."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

from cryptography import x509

from lab.vmctl import nspawn_pid
from tests.conftest import REPO, ssh, stack_config

EXAMPLES = REPO / "examples"


# VMs take high host indices: the `hosts` fixture counts up from 10.
_vm_indices = itertools.count(150)
_vm_lock = threading.Lock()


def vm_index() -> int:
    with _vm_lock:
        return next(_vm_indices)


def vmctl(lab: Any, verb: str, index: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m lab.vmctl VERB ...` in a process of its own, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "lab.vmctl", verb, "--lab", lab.name, "--subnet", lab.subnet,
                           "--index", str(index), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def banner(addr: str) -> bytes:
    """What the SSH port at addr says first (b"" when nothing answers)."""
    try:
        with socket.create_connection((addr, 22), timeout=2) as s:
            s.settimeout(5)
            return s.recv(64)
    except OSError:
        return b""


def host_keys(addr: str, cluster: Any) -> set[str]:
    """The machine's SSH host keys ("type base64"), read on the machine over SSH."""
    rc, out = ssh(SimpleNamespace(addr=addr), cluster, "cat /etc/ssh/ssh_host_*_key.pub")
    assert rc == 0, out
    return {" ".join(line.split()[:2]) for line in out.splitlines() if line.strip()}


def nspawn_running(lab: Any, index: int) -> bool:
    root = lab.hosts_dir / str(index) / "merged"
    return nspawn_pid(SimpleNamespace(name=f"{lab.prefix}h{index}", root=root)) is not None


def stops(lab: Any, index: int) -> list[dict[str, Any]]:
    path = lab.hosts_dir / str(index) / "stops.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def vm_command_config(lab: Any, cluster: Any, index: int, image: str) -> dict[str, Any]:
    base = stack_config(cluster, [], nodes=[])
    return {
        "vmctl": {"cli": f"{sys.executable} -m lab.vmctl", "dir": str(REPO),
                  "args": f"--lab {lab.name} --subnet {lab.subnet}"},
        "vm": {"index": index, "hostname": "vm-one", "image": image},
        "nodeId": "gpu-vm1",
        **{k: base[k] for k in ("pkiDir", "servers", "agent")},
        "ssh": {**base["ssh"], "wait": 60},
    }


NODE_RESOURCES = {f"{t}::gpu-vm1" for t in (
    "llmgw:index:Node", *(f"llmgw:index:Node$pulumi-python:dynamic/llmgw:{r}"
                          for r in ("ClientCertificate", "NodeIdentity", "AgentInstall", "EngineCheck")))}


def step_ops(run: Any) -> dict[str, str]:
    """urn type::name -> the step's op, from the run's resource events."""
    ops = {}
    for e in run.events:
        meta = (e.get("resOutputsEvent") or e.get("resourcePreEvent") or {}).get("metadata")
        if meta and meta.get("op") != "same":
            ops[meta["urn"].split("::", 2)[2]] = meta["op"]
    return ops


def preview_inputs(run: Any, type_suffix: str) -> dict[str, Any]:
    for e in run.events:
        meta = (e.get("resourcePreEvent") or {}).get("metadata")
        if meta and meta["type"].endswith(type_suffix):
            return meta["new"]["inputs"]
    raise AssertionError(f"no {type_suffix} in the preview's events")


def serial_on(addr: str, cluster: Any) -> str:
    rc, pem = ssh(SimpleNamespace(addr=addr), cluster, "cat /etc/llmgw/agent.pem")
    assert rc == 0, pem
    return format(x509.load_pem_x509_certificate(pem.encode()).serial_number, "x")


def reimage_replaces_the_node(stack: Any, lab: Any, cluster: Any, index: int, first_keys: set[str]) -> tuple[Any, set[str]]:
    """Re-image the VM (the image changes in the config) with one `up`: it must replace the VM and every resource
    of its node, with no host-key refusal, and the machine must answer with new host keys. (the up, those keys)"""
    stack.set_config(vm_command_config(lab, cluster, index, "debian-12-r2"))
    reimage = stack.up()
    assert reimage.ok, reimage.output
    assert "host key" not in reimage.output.lower(), reimage.output
    replaced = {k for k, op in step_ops(reimage).items() if op in ("replace", "create-replacement")}
    assert replaced == {"command:local:Command::vm", *NODE_RESOURCES}, step_ops(reimage)
    new_keys = host_keys(lab.addr(index), cluster)
    assert new_keys and not new_keys & first_keys, "the VM was not re-imaged"
    return reimage, new_keys


def assert_the_old_machine_was_left_clean(lab: Any, index: int, since: float) -> None:
    """A re-image since ``since`` stopped the VM once while it ran, the node's files already removed."""
    reimage_stops = [s for s in stops(lab, index) if s["at"] > since and s["running"]]
    assert len(reimage_stops) == 1, reimage_stops
    assert reimage_stops[0]["etc_llmgw"] in (None, []), reimage_stops
    assert not reimage_stops[0]["paths"]["/usr/local/bin/llmgw"], reimage_stops


def assert_destroy_cleans_the_node_then_stops_the_vm(stack: Any, lab: Any, index: int, addr: str) -> None:
    """`pulumi destroy`: the node's files are gone while the VM still runs, then the VM stops."""
    since = time.time()
    destroy = stack.destroy()
    assert destroy.ok, destroy.output
    destroy_stops = [s for s in stops(lab, index) if s["at"] > since]
    assert destroy_stops == [{**destroy_stops[0], "running": True, "etc_llmgw": None, "paths": {
        "/etc/llmgw": False, "/usr/local/bin/llmgw": False, "/etc/systemd/system/llmgw-agent.service": False}}]
    assert not nspawn_running(lab, index)
    assert banner(addr) == b""
