"""The readiness verdict wired into EngineCheck (issue 38, items 2, 3 and 6) on a fake node: the probe's one run
reads nvidia-smi -q -x (the lab's stand-in replaying the real H200, with a fault of the fixtures' README), the
kernel log's Xid lines and the declared HCAs' ports; the problems, the gate and the ``readiness`` output."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from lab.doubles import infiniband, nvidia_smi
from llmgw_pulumi import errors
from llmgw_pulumi.providers.engines import EngineCheckProvider
from tests.fakenode import FakeNode
from tests.fixtures.faults import fault
from tests.unit.fake_node_resources import CONN, HOST_KEY
from tests.unit.nvidia_smi_on_node import CAPTURED, on_path
from tests.unit.nvidia_smi_on_node import node as node  # noqa: F401  (the fixture)
from tests.unit.provider_inputs import checked

H200 = {"gpu_count": 8, "gpu_model": "NVIDIA H200", "gpu_memory_mib": 143771, "min_driver": "570", "min_cuda": "12.8"}
FABRIC = [{"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}]
PORTS = {"state": "ACTIVE", "min_rate_gbps": 400}
ROW_REMAP = fault("row remap pending").edits
PERSISTENCE_OFF = fault("persistence mode off").edits


def smi(node: FakeNode, edits: list[tuple[str, str]] | tuple[()] = (), gpu: int = 0) -> None:
    on_path(node, nvidia_smi.build_nvidia_smi(8, fixtures=CAPTURED, edits=edits, gpu=gpu))


def hcas(node: FakeNode, **states: infiniband.PortState) -> None:
    for hca in ("mlx5_0", "mlx5_1"):
        infiniband.install_hca(node.path("/sys/class/infiniband"), hca, {"1": states.get(hca, infiniband.ACTIVE)})


def kernel_log(node: FakeNode, *lines: str, mode: int = 0o755) -> None:
    """A journalctl under the node's root printing ``lines`` as the kernel's (and leaving a mark it ran)."""
    body = "".join(f"echo {shlex.quote(line)}\n" for line in lines)
    node.write("/usr/bin/journalctl", f"#!/bin/sh\ntouch {shlex.quote(str(node.state / 'journalctl-ran'))}\n{body}"
               .encode(), mode)


def inputs(**extra: Any) -> dict[str, Any]:
    return checked(EngineCheckProvider(), {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY,
                                           "fail_on_problems": False, "fabrics": FABRIC,
                                           "hardware": {**H200, "hca_ports": PORTS}, **extra})


def test_a_healthy_node_as_declared_is_ready_in_the_same_one_run(node: FakeNode) -> None:
    smi(node)
    hcas(node)
    runs = len(node.runs)
    outs = EngineCheckProvider().create(inputs(fail_on_critical_problems=True)).outs
    assert outs["problems"] == [] and outs["readiness"] == "ready"
    assert len(node.runs) == runs + 1, "the health is read in the probe's one run"


def test_a_pending_row_remap_names_the_gpu_and_its_fix_and_the_gate_fails_the_node(node: FakeNode) -> None:
    smi(node, ROW_REMAP, gpu=3)
    hcas(node)
    outs = EngineCheckProvider().create(inputs()).outs
    (problem,) = outs["problems"]
    assert (problem["check"], problem["severity"]) == ("row-remap-pending", "critical")
    assert problem["subject"] == "GPU 3 (GPU-65decab1-06a8-ac78-1f56-8a52138b6ec5, 00000000:00:09.0)"
    assert "gpu-01" in problem["problem"] and "ssh deploy@10.0.0.11 sudo nvidia-smi -r -i 3" in problem["hint"]
    assert outs["readiness"] == "not ready"
    with pytest.raises(errors.NodeNotReadyError, match="row remap pending") as err:
        EngineCheckProvider().create(inputs(fail_on_critical_problems=True))
    assert "nvidia-smi -r -i 3" in str(err.value)


def test_warnings_never_fail_the_node(node: FakeNode) -> None:
    smi(node, PERSISTENCE_OFF)
    hcas(node)
    outs = EngineCheckProvider().create(inputs(fail_on_critical_problems=True)).outs
    assert [(p["check"], p["severity"]) for p in outs["problems"]] == [("persistence-mode", "warning")]
    assert outs["readiness"] == "degraded"


def test_a_down_port_of_a_declared_hca_is_a_fabric_problem(node: FakeNode) -> None:
    smi(node)
    hcas(node, mlx5_1=infiniband.DOWN)
    outs = EngineCheckProvider().create(inputs()).outs
    (problem,) = outs["problems"]
    assert (problem["subject"], problem["check"], problem["severity"]) == ("mlx5_1 port 1", "ib-phys-state", "critical")
    assert "Disabled" in problem["found"] and "ssh deploy@10.0.0.11 ibstat mlx5_1 1" in problem["hint"]
    # Without declared port expectations the ports are not judged (only that the HCA exists).
    undeclared = EngineCheckProvider().create(inputs(hardware=H200)).outs
    assert undeclared["problems"] == [] and undeclared["readiness"] == "ready"


def test_a_slow_port_and_an_undeclared_node_count(node: FakeNode) -> None:
    smi(node)
    hcas(node, mlx5_0=infiniband.SLOW)
    outs = EngineCheckProvider().create(inputs(hardware={"gpu_count": 4, "hca_ports": PORTS})).outs
    assert sorted((p["subject"], p["check"], p["severity"]) for p in outs["problems"]) == [
        ("GPUs", "gpu-count", "warning"), ("mlx5_0 port 1", "ib-rate", "critical")]


def test_xid_lines_since_boot_are_read_and_a_new_one_is_seen_by_refresh(node: FakeNode) -> None:
    smi(node)
    hcas(node)
    kernel_log(node, "[ 12.5] gpu-01 kernel: NVRM: Xid (PCI:0000:00:06): 13, pid=4121, name=python3, Graphics "
                     "Exception")
    p = EngineCheckProvider()
    outs = p.create(inputs()).outs
    assert [(p["check"], p["severity"]) for p in outs["problems"]] == [("xid", "warning")]
    assert outs["problems"][0]["subject"].startswith("GPU 0 (GPU-65decab1")
    assert outs["readiness"] == "degraded"
    # A new Xid: no change for the diff (the inputs are the same), a refresh reads it.
    assert p.diff("gpu-01", outs, inputs()).changes is False
    kernel_log(node, "NVRM: Xid (PCI:0000:00:06): 13, pid=4121, name=python3, Graphics Exception",
               "NVRM: Xid (PCI:0000:00:08): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    again = p.read("gpu-01", outs).outs
    fallen = [x for x in again["problems"] if x["severity"] == "critical"]
    assert [x["subject"].split(" (")[0] for x in fallen] == ["GPU 2"] and "Xid 79" in fallen[0]["found"]
    assert again["readiness"] == "not ready"


def test_a_kernel_log_reader_others_could_change_is_never_run(node: FakeNode) -> None:
    smi(node)
    hcas(node)
    kernel_log(node, "NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.", mode=0o777)
    outs = EngineCheckProvider().create(inputs()).outs
    assert outs["problems"] == [] and not (node.state / "journalctl-ran").exists()
    kernel_log(node, "NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.")  # positive control: root's
    assert [p["check"] for p in EngineCheckProvider().create(inputs()).outs["problems"]] == ["xid"]
    assert (node.state / "journalctl-ran").exists()


def test_an_nvidia_smi_whose_report_does_not_parse_is_a_problem_not_a_traceback(node: FakeNode) -> None:
    text = nvidia_smi.build_nvidia_smi(1, fixtures=CAPTURED).replace("<nvidia_smi_log>", "<nvidia_smi_log><<", 1)
    on_path(node, text)
    outs = EngineCheckProvider().create(inputs(hardware={"gpu_count": 1}, fabrics=[])).outs
    (problem,) = outs["problems"]
    assert (problem["check"], problem["severity"]) == ("nvidia-smi-unreadable", "critical")
    assert outs["readiness"] == "not ready"


def test_a_node_without_nvidia_smi_declared_with_gpus_is_not_ready(node: FakeNode) -> None:
    outs = EngineCheckProvider().create(inputs(fabrics=[], hardware={"gpu_count": 8})).outs
    assert [(p["check"], p["found"]) for p in outs["problems"]] == [("gpu-count", "0 GPU(s)")]
    assert outs["readiness"] == "not ready"
    # Nothing declared: no GPU is no problem.
    assert EngineCheckProvider().create(inputs(fabrics=[], hardware=None)).outs["readiness"] == "ready"


def test_refresh_reads_a_failing_node_without_failing_even_with_the_gate_on(node: FakeNode) -> None:
    smi(node)
    hcas(node)
    p = EngineCheckProvider()
    outs = p.create(inputs(fail_on_critical_problems=True)).outs
    smi(node, ROW_REMAP)
    again = p.read("gpu-01", outs).outs
    assert [x["check"] for x in again["problems"]] == ["row-remap-pending"] and again["readiness"] == "not ready"


def test_a_declared_hca_the_node_lacks_is_reported_once_by_the_inventory(node: FakeNode) -> None:
    smi(node)
    infiniband.install_hca(node.path("/sys/class/infiniband"), "mlx5_0")
    outs = EngineCheckProvider().create(inputs()).outs
    (problem,) = outs["problems"]
    assert (problem["hca"], problem["status"], problem["severity"]) == ("mlx5_1", "missing", "critical")
    assert outs["readiness"] == "not ready"
