"""EngineCheck's inventory on a fake node: GPUs from an nvidia-smi stand-in replaying a real H200, HCAs from sysfs.

The stand-in is lab/doubles/nvidia_smi.py, built from ../shared/fixtures/nvidia-h200; the scripts are the
package's own, run under a temporary root (tests/fakenode.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from lab.doubles import nvidia_smi
from lab.doubles.nvidia_smi import FIXTURES, QUERY_NOHEADER_FIELDS, failing_nvidia_smi
from llmgw_pulumi import errors
from llmgw_pulumi.providers.engines import EngineCheckProvider
from tests.fakenode import FakeNode
from tests.unit.fake_node_resources import CONN, HOST_KEY
from tests.unit.health_samples import UUID0
from tests.unit.nvidia_smi_on_node import CAPTURED, on_path
from tests.unit.nvidia_smi_on_node import node as node  # noqa: F401  (the fixture)
from tests.unit.provider_inputs import checked


def build_nvidia_smi(gpus: int = 1) -> str:
    return nvidia_smi.build_nvidia_smi(gpus, fixtures=CAPTURED)

H200 = {"index": 0, "name": "NVIDIA H200", "memory_mib": 143771, "uuid": UUID0, "pci_bus_id": "00000000:00:06.0",
        "compute_cap": "9.0"}


def with_hcas(node: FakeNode, *names: str, root: str = "/sys/class/infiniband") -> None:
    for n in names:
        node.path(f"{root}/{n}").mkdir(parents=True)


def inputs(**extra: Any) -> dict[str, Any]:
    return checked(EngineCheckProvider(), {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY,
                                           "fail_on_problems": False, **extra})


def test_a_node_with_one_h200_shows_it_with_driver_cuda_and_hcas(node: FakeNode) -> None:
    on_path(node, build_nvidia_smi(1))
    with_hcas(node, "mlx5_1", "mlx5_0")
    engine = "/opt/llama/llama-server"
    node.write(engine, b"#!/bin/sh\necho version 1\n", 0o755)
    runs = len(node.runs)
    outs = EngineCheckProvider().create(inputs(engines={"llamacpp": {"bin": engine}},
                                               fabrics=[{"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}])).outs
    assert outs["inventory"] == {"gpus": [H200], "driver": "580.159.04", "cuda": "13.0", "hcas": ["mlx5_0", "mlx5_1"]}
    assert outs["problems"] == [] and outs["engines_ok"] is True
    assert len(node.runs) == runs + 1, "the engines and the inventory are read in one run"


def test_eight_gpus_at_the_configured_discovery_path(node: FakeNode) -> None:
    node.write("/opt/nvidia/bin/nvidia-smi", build_nvidia_smi(8).encode(), 0o755)
    outs = EngineCheckProvider().create(inputs(discovery={"nvidia_smi": "/opt/nvidia/bin/nvidia-smi"})).outs
    gpus = outs["inventory"]["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert len({g["uuid"] for g in gpus}) == 8 and len({g["pci_bus_id"] for g in gpus}) == 8
    assert {g["name"] for g in gpus} == {"NVIDIA H200"} and outs["inventory"]["cuda"] == "13.0"
    assert outs["problems"] == []


def test_a_node_without_nvidia_smi_has_an_empty_inventory_and_no_problem(node: FakeNode) -> None:
    outs = EngineCheckProvider().create(inputs()).outs
    assert outs["inventory"] == {"gpus": [], "driver": "", "cuda": "", "hcas": []}
    assert outs["problems"] == [] and outs["engines_ok"] is True


def test_nvidia_smi_configured_where_there_is_none_is_a_problem(node: FakeNode) -> None:
    outs = EngineCheckProvider().create(inputs(discovery={"nvidia_smi": "/opt/nvidia/bin/nvidia-smi"})).outs
    (p,) = outs["problems"]
    assert p["status"] == "missing" and "/opt/nvidia/bin/nvidia-smi" in p["problem"] and "gpu-01" in p["problem"]
    assert "discovery.nvidiaSmi" in p["hint"]


def test_an_nvidia_smi_that_fails_is_a_problem_with_its_message(node: FakeNode) -> None:
    on_path(node, failing_nvidia_smi())
    outs = EngineCheckProvider().create(inputs()).outs
    assert outs["inventory"]["gpus"] == []
    (p,) = outs["problems"]
    assert p["status"] == "fails" and "rc=9" in p["problem"] and "couldn't communicate with the NVIDIA driver" in p["problem"]
    assert "gpu-01" in p["problem"] and p["hint"].startswith("ssh deploy@10.0.0.11 ")
    assert outs["engines_ok"] is True, "no engine is at fault"


def test_an_nvidia_smi_without_a_field_the_query_asks_for_fails_in_its_own_words(node: FakeNode) -> None:
    # As an older driver's nvidia-smi, which has no compute_cap: plain `nvidia-smi` works, the query does not.
    older = build_nvidia_smi(1).replace(f"'--query-gpu={QUERY_NOHEADER_FIELDS} --format=csv,noheader,nounits')",
                                        "'not-recorded')").replace(" compute_cap ", " ")
    on_path(node, older)
    (p,) = EngineCheckProvider().create(inputs()).outs["problems"]
    assert p["status"] == "fails" and 'rc=2; Field "compute_cap" is not a valid field to query.' in p["problem"], p


def test_a_declared_hca_the_node_lacks_is_a_problem_until_it_appears(node: FakeNode) -> None:
    with_hcas(node, "mlx5_0", root="/run/ib")
    p = EngineCheckProvider()
    news = inputs(fabrics=[{"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}], discovery={"ib_root": "/run/ib"})
    outs = p.create(news).outs
    (problem,) = outs["problems"]
    assert (problem["fabric"], problem["hca"], problem["status"]) == ("ib-east", "mlx5_1", "missing")
    assert "ib-east" in problem["problem"] and "mlx5_1" in problem["problem"] and "gpu-01" in problem["problem"]
    assert "under /run/ib: mlx5_0" in problem["problem"]
    assert problem["hint"].startswith("ssh deploy@10.0.0.11 ls /run/ib")
    assert outs["inventory"]["hcas"] == ["mlx5_0"]

    # A standing problem is not a change; a refresh reads the node again.
    assert p.diff("gpu-01", outs, news).changes is False
    with_hcas(node, "mlx5_1", root="/run/ib")
    again = p.read("gpu-01", outs).outs
    assert again["problems"] == [] and again["inventory"]["hcas"] == ["mlx5_0", "mlx5_1"]

    # Reported like an engine problem: with fail_on_problems it fails the deployment.
    node.path("/run/ib/mlx5_1").rmdir()
    with pytest.raises(errors.EngineWillNotRunError, match="mlx5_1"):
        p.update("gpu-01", outs, {**news, "fail_on_problems": True})


def test_new_inputs_are_optional_and_absent_ones_are_no_change() -> None:
    p = EngineCheckProvider()
    old = inputs(engines={"vllm": {"bin": "/opt/vllm"}})  # state written before fabrics and discovery existed
    stored = {**old, "problems": [], "engines_ok": True}
    assert p.diff("gpu-01", stored, inputs(engines={"vllm": {"bin": "/opt/vllm"}})).changes is False
    assert p.diff("gpu-01", {**stored, "inventory": {"gpus": [H200]}}, old).changes is False
    assert p.diff("gpu-01", stored, inputs(engines={"vllm": {"bin": "/opt/vllm"}},
                                          fabrics=[{"name": "ib-east", "hcas": ["mlx5_0"]}])).changes is True
    assert p.diff("gpu-01", stored, inputs(engines={"vllm": {"bin": "/opt/vllm"}},
                                          discovery={"ib_root": "/run/ib"})).changes is True


def test_bad_fabrics_and_discovery_are_refused_by_check() -> None:
    res = EngineCheckProvider().check({}, {"node_id": "gpu-01", "connection": CONN,
                                           "fabrics": [{"name": "ib-east", "hcas": []}],
                                           "discovery": {"nvidia_smi": "nvidia-smi"}})
    reasons = " | ".join(f.reason for f in res.failures)
    assert "fabrics[0].hcas" in reasons and "discovery.nvidia_smi" in reasons, reasons


def test_the_captured_output_is_the_shared_fixtures_where_they_are_beside_the_checkout():
    if not FIXTURES.is_dir():
        pytest.skip("../shared/fixtures is not beside this checkout: nothing to compare the copy with")
    # README.md is the repository's own (it lists the fault fixtures' edits); every other file is a copy.
    copied = sorted(p.name for p in CAPTURED.iterdir() if p.name != "README.md")
    assert len(copied) == 7
    assert {n: (CAPTURED / n).read_bytes() for n in copied} == {n: (FIXTURES / n).read_bytes() for n in copied}
