"""The readiness verdict (issue 38) end to end under the pulumi CLI, on three lab hosts.

Each carries the nvidia-smi stand-in replaying the real H200 (lab/doubles/nvidia_smi.py) and, where its fabric
declares HCAs, a /sys/class/infiniband stand-in under its ibRoot (lab/doubles/infiniband.py): one node is
healthy (8 GPUs, its HCA ACTIVE at NDR), one has a row remap pending on its GPU (a fault of
tests/fixtures/nvidia-h200/README.md), one has an HCA whose port is down. The problems appear under the right
node with their fix; a no-op `up` reaches no node; with llmgw:failOnProblems the faulty nodes fail and the
healthy one onboards; the faults fixed, `up --refresh` clears them.

On one more host, every fault of that README in turn, and an Xid in its kernel log (lab/doubles/kernel_log.py's
journalctl), through the node probe EngineCheck runs; one of them, and the Xid, through `up --refresh` too.
"""

from __future__ import annotations

import base64
import shlex
import time
from typing import Any

import pytest

from lab.doubles import infiniband
from lab.doubles.kernel_log import build_journalctl
from lab.doubles.nvidia_smi import FIXTURES, build_nvidia_smi
from lab.local import give_hardware
from llmgw_pulumi.config.specs import EngineCheckSpec
from llmgw_pulumi.nodestate.commands import Script
from llmgw_pulumi.providers import base, engines
from llmgw_pulumi.ssh import sessions, transport
from tests.conftest import ssh, stack_config
from tests.fixtures.faults import FAULTS, fault

pytestmark = [pytest.mark.hosts, pytest.mark.engine,
              pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared/fixtures not beside the checkout")]

IB_ROOT = "/var/lib/llmgw-test/infiniband"
ROW_REMAP = fault("row remap pending").edits
HARDWARE = {"gpuModel": "NVIDIA H200", "gpuMemoryMib": 143771, "minDriver": "570", "minCuda": "12.8",
            "hcaPorts": {"minRateGbps": 400}}


def by_node(run, severity: str) -> dict[str, list[str]]:
    """The CLI's diagnostics of ``severity``, by the node of the EngineCheck they are under."""
    out: dict[str, list[str]] = {}
    for d in run.diagnostics(severity):
        if "llmgw:EngineCheck::" in d.get("urn", ""):
            out.setdefault(d["urn"].rsplit("::", 1)[1], []).append(d["message"])
    return out


def fleet_lines(stack) -> dict[str, str]:
    """The stack output ``fleet``: node id -> its line."""
    lines: dict[str, str] = stack.outputs()["fleet"]
    print("\n".join(lines.values()))
    return lines


def test_problems_appear_under_their_node_the_gate_fails_only_them_and_fixing_clears_them(cluster, hosts, new_stack):
    healthy, faulty, fabric = hosts(3, start=False)
    nodes = [
        {"id": healthy.hostname, "address": healthy.addr, "fabric": {"name": "ib-test", "hcas": ["mlx5_0"]},
         "discovery": {"ibRoot": IB_ROOT}, "hardware": {"gpuCount": 8}},
        {"id": faulty.hostname, "address": faulty.addr, "hardware": {"gpuCount": 1}},
        {"id": fabric.hostname, "address": fabric.addr, "fabric": {"name": "ib-test", "hcas": ["mlx5_0", "mlx5_1"]},
         "discovery": {"ibRoot": IB_ROOT}, "hardware": {"gpuCount": 1}},
    ]
    give_hardware(healthy, nodes[0], gpus=8, smi=True)
    give_hardware(faulty, nodes[1], gpus=1, smi_edits=ROW_REMAP, smi=True)
    give_hardware(fabric, nodes[2], gpus=1, ports={"mlx5_1": {"1": infiniband.DOWN}}, smi=True)
    for h in (healthy, faulty, fabric):
        h.start()
    config = stack_config(cluster, [healthy, faulty, fabric], nodes=nodes, hardware=HARDWARE)
    stack = new_stack(config)

    # Without the gate: every node onboards; the problems are warnings under the node's check, with their fix.
    up = stack.up()
    assert up.ok, up.output
    warned = by_node(up, "warning")
    assert healthy.hostname not in warned, warned
    (remap,) = warned[faulty.hostname]
    assert "GPU 0 (GPU-65decab1-06a8-ac78-1f56-8a52138b6ec2, 00000000:00:06.0)" in remap and "row remap" in remap
    assert f"ssh deploy@{faulty.addr} sudo nvidia-smi -r -i 0" in remap
    (down,) = warned[fabric.hostname]
    assert "mlx5_1 port 1" in down and "Disabled" in down and f"ssh deploy@{fabric.addr} ibstat mlx5_1 1" in down

    out = stack.outputs()
    assert [out[h.hostname]["readiness"] for h in (healthy, faulty, fabric)] == ["ready", "not ready", "not ready"]
    assert out[healthy.hostname]["problems"] == []
    (problem,) = out[faulty.hostname]["problems"]
    assert (problem["check"], problem["severity"]) == ("row-remap-pending", "critical")
    assert "sudo nvidia-smi -r -i 0" in problem["hint"]
    (problem,) = out[fabric.hostname]["problems"]
    assert (problem["subject"], problem["check"]) == ("mlx5_1 port 1", "ib-phys-state")
    lines = fleet_lines(stack)
    assert " ready " in lines[healthy.hostname] and lines[healthy.hostname].endswith("none")
    assert " not ready " in lines[faulty.hostname] and lines[faulty.hostname].endswith("1: GPU 0 row-remap-pending")
    assert lines[fabric.hostname].endswith("1: mlx5_1 port 1 ib-phys-state")

    # A standing problem is no change, and a no-op `up` reaches no node.
    opens = [h.passive_tcp_opens() for h in (healthy, faulty, fabric)]
    again = stack.up()
    assert again.ok and set(again.changes) == {"same"}, again.output
    assert [h.passive_tcp_opens() for h in (healthy, faulty, fabric)] == opens, "a no-op up reached a node"

    # The gate on, stack-wide: the nodes that are not ready fail, each with its problem and fix; the healthy one
    # onboards.
    stack.set_config({**config, "failOnProblems": True})
    gated = stack.up()
    assert not gated.ok, gated.output
    failed = by_node(gated, "error")
    assert set(failed) == {faulty.hostname, fabric.hostname}, failed
    assert "not ready" in failed[faulty.hostname][0] and "sudo nvidia-smi -r -i 0" in failed[faulty.hostname][0]
    assert "mlx5_1 port 1" in failed[fabric.hostname][0]
    checks = {r["outputs"]["node_id"]: r for r in stack.export()["resources"] if r["type"].endswith("EngineCheck")}
    assert checks[healthy.hostname]["inputs"].get("fail_on_critical_problems") is True
    assert checks[healthy.hostname]["outputs"]["readiness"] == "ready"

    # Fixed: the GPU reset (its remap done), the cable plugged in. `up --refresh` reads them again and passes.
    smi = base64.b64encode(build_nvidia_smi(1).encode()).decode()
    rc, text = ssh(faulty, cluster, f"echo {smi} | base64 -d | sudo tee /usr/bin/nvidia-smi >/dev/null")
    assert rc == 0, text
    port = f"{IB_ROOT}/mlx5_1/ports/1"
    for name, value in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("rate", "400 Gb/sec (4X NDR)")):
        rc, text = ssh(fabric, cluster, f"echo {shlex.quote(value)} | sudo tee {port}/{name} >/dev/null")
        assert rc == 0, text
    fixed = stack.up(refresh=True)
    assert fixed.ok, fixed.output
    assert not by_node(fixed, "warning") and not by_node(fixed, "error"), fixed.output
    out = stack.outputs()
    assert [out[h.hostname]["readiness"] for h in (healthy, faulty, fabric)] == ["ready"] * 3
    assert all(out[h.hostname]["problems"] == [] for h in (healthy, faulty, fabric))
    lines = fleet_lines(stack)
    assert all(" ready " in lines[h.hostname] and lines[h.hostname].endswith("none") for h in (healthy, faulty, fabric))


def install(spec: EngineCheckSpec, known: tuple[str | None, Any], path: str, text: str) -> None:
    """``text`` as root's ``path`` (mode 0755) on the node, over its pooled session, put in place at once."""
    with base.session(spec.connection, spec.node_id, *known) as s:
        res = s.run(Script('cat > "$1.new" && chmod 0755 "$1.new" && mv -f "$1.new" "$1"', (path,), text.encode()))
    assert res.rc == 0, res


def test_every_fault_fixture_and_an_xid_reach_their_node_through_the_probe_and_refresh(cluster, hosts, new_stack):
    (host,) = hosts(1, start=False)
    node = {"id": host.hostname, "address": host.addr, "hardware": {"gpuCount": 1}}
    give_hardware(host, node, gpus=1, smi=True)
    host.start()
    stack = new_stack(stack_config(cluster, [host], nodes=[node], hardware=HARDWARE))
    up = stack.up()
    assert up.ok, up.output
    assert stack.outputs()[host.hostname]["readiness"] == "ready"
    (check,) = [r for r in stack.export()["resources"] if r["type"].endswith("EngineCheck")]
    # The node's check as the provider reads it on a refresh: its spec and the host key NodeIdentity recorded.
    spec, known = EngineCheckSpec.from_props(check["outputs"]), base.known_keys(check["outputs"])
    target = f"ssh deploy@{host.addr} "

    # Each fault's nvidia-smi on the node, then the probe EngineCheck runs, over one pooled SSH connection.
    t = time.monotonic()
    with sessions.use(transport.Pool()):
        for f in FAULTS:
            install(spec, known, "/usr/bin/nvidia-smi", build_nvidia_smi(1, edits=f.edits))
            found = engines._probe(spec, known)
            assert [(p["check"], p["severity"]) for p in found["problems"]] == [(f.check, f.severity)], f.fault
            (p,) = found["problems"]
            assert f"on {host.hostname}:" in p["problem"] and f.fix in p["hint"], (f.fault, p)
            if f.fix.startswith("sudo "):
                assert target + f.fix in p["hint"], (f.fault, p["hint"])
            assert found["readiness"] == ("not ready" if f.severity == "critical" else "degraded"), f.fault
    print(f"{len(FAULTS)} faults probed in {time.monotonic() - t:.1f}s")

    # One more fault, and an Xid in the kernel log: `up --refresh` reads them and shows both under the node.
    width = fault("PCIe link at half width")
    with sessions.use(transport.Pool()):
        install(spec, known, "/usr/bin/nvidia-smi", build_nvidia_smi(1, edits=width.edits))
        rc, text = ssh(host, cluster, "sudo cp -p /usr/bin/journalctl /usr/bin/journalctl.lab-real")
        assert rc == 0, text
        install(spec, known, "/usr/bin/journalctl", build_journalctl(hostname=host.hostname))
    refreshed = stack.up(refresh=True)
    assert refreshed.ok, refreshed.output
    out = stack.outputs()[host.hostname]
    assert out["readiness"] == "not ready"
    problems = {p["check"]: p for p in out["problems"]}
    assert set(problems) == {width.check, "xid"}, out["problems"]
    assert problems[width.check]["severity"] == width.severity and width.fix in problems[width.check]["hint"]
    xid = problems["xid"]
    assert xid["subject"] == "GPU 0 (GPU-65decab1-06a8-ac78-1f56-8a52138b6ec2, 00000000:00:06.0)", xid
    assert xid["found"].startswith("Xid 79 since boot: the GPU has fallen off the bus"), xid
    assert xid["severity"] == "critical" and f"reboot {host.hostname}: {target}sudo systemctl reboot" in xid["hint"]
    line = fleet_lines(stack)[host.hostname]
    assert " not ready " in line and line.endswith(f"problems: 2: GPU 0 {width.check}, GPU 0 xid"), line

    # The node's own journalctl back: the probe reads no Xid from it (nor did it before: every fault was alone).
    rc, text = ssh(host, cluster, "sudo mv -f /usr/bin/journalctl.lab-real /usr/bin/journalctl && journalctl -k -b -q -n 0")
    assert rc == 0, text
    with sessions.use(transport.Pool()):
        assert [p["check"] for p in engines._probe(spec, known)["problems"]] == [width.check]
