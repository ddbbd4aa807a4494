"""GPU and fabric inventory (issue 11, items 3 and 4) on real hosts under the pulumi CLI.

Two hosts carry the nvidia-smi stand-in that replays a real H200 node (lab/doubles/nvidia_smi.py): one
GPU on PATH, eight at a configured discovery path. A third has none. One declares a fabric HCA it lacks
(its ibRoot is a directory this test makes, with one HCA in it).
"""

import pytest

from lab.doubles.nvidia_smi import FIXTURES, build_nvidia_smi
from tests.conftest import ssh, stack_config

pytestmark = [pytest.mark.hosts, pytest.mark.engine,
              pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared/fixtures not beside the checkout")]

IB_ROOT = "/var/lib/llmgw-test/infiniband"
SMI_AT = "/opt/nvidia/bin/nvidia-smi"


def install(host, path: str, text: str, mode: int = 0o755) -> None:
    """A file in the host's upper dir before it boots: part of its root from the first moment."""
    dest = host.upper / path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    dest.chmod(mode)


def warned(run, text: str) -> bool:
    """The CLI showed a warning with ``text``."""
    return any(line.strip().startswith("warning:") and text in line for line in run.output.splitlines())


def test_inventory_and_fleet_show_the_gpus_and_a_missing_hca(cluster, hosts, new_stack):
    one, eight, none = hosts(3, start=False)
    install(one, "/usr/bin/nvidia-smi", build_nvidia_smi(1))
    install(eight, SMI_AT, build_nvidia_smi(8))
    (one.upper / IB_ROOT.lstrip("/") / "mlx5_0").mkdir(parents=True)
    for h in (one, eight, none):
        h.start()
    config = stack_config(cluster, [one, eight, none], nodes=[
        {"id": one.hostname, "address": one.addr, "fabric": {"name": "ib-test", "hcas": ["mlx5_0", "mlx5_1"]},
         "discovery": {"ibRoot": IB_ROOT}},
        {"id": eight.hostname, "address": eight.addr, "discovery": {"nvidiaSmi": SMI_AT}},
        {"id": none.hostname, "address": none.addr},
    ])
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output
    print(f"\npulumi up, 3 nodes with inventory: {up.seconds:.1f}s")

    # The missing HCA is a warning under the node's EngineCheck, naming node, fabric and HCA.
    missing = f"fabric ib-test declares HCA mlx5_1, which {one.hostname} does not have (under {IB_ROOT}: mlx5_0)"
    assert warned(up, missing), up.output
    check = next(d for d in up.diagnostics("warning") if missing in d["message"])
    assert check["urn"].endswith(f"llmgw:EngineCheck::{one.hostname}")

    out = stack.outputs()
    assert {k: out[one.hostname][k] for k in ("gpus", "gpu_model", "driver", "cuda", "hcas")} == {
        "gpus": 1, "gpu_model": "NVIDIA H200", "driver": "580.159.04", "cuda": "13.0", "hcas": ["mlx5_0"]}
    assert [p["hca"] for p in out[one.hostname]["problems"]] == ["mlx5_1"]
    assert out[one.hostname]["engine_problems"] == []
    assert (out[eight.hostname]["gpus"], out[eight.hostname]["gpu_model"]) == (8, "NVIDIA H200")
    assert out[eight.hostname]["problems"] == []
    assert (out[none.hostname]["gpus"], out[none.hostname]["gpu_model"], out[none.hostname]["driver"]) == (0, "", "")
    assert out[none.hostname]["problems"] == []

    inventories = {r["outputs"]["node_id"]: r["outputs"]["inventory"]
                   for r in stack.export()["resources"] if r["type"].endswith("EngineCheck")}
    (gpu,) = inventories[one.hostname]["gpus"]
    assert (gpu["name"], gpu["memory_mib"], gpu["uuid"]) == ("NVIDIA H200", 143771, "GPU-65decab1-06a8-ac78-1f56-8a52138b6ec2")
    assert len({g["uuid"] for g in inventories[eight.hostname]["gpus"]}) == 8
    assert inventories[none.hostname] == {"gpus": [], "driver": "", "cuda": "", "hcas": []}

    # The stack output `fleet`, as a person reads it: one line per node, in `up`'s Outputs too.
    lines = out["fleet"]
    assert "1x NVIDIA H200" in lines[one.hostname] and "1: mlx5_1 missing" in lines[one.hostname]
    assert "8x NVIDIA H200" in lines[eight.hostname] and lines[eight.hostname].endswith("none")
    for h in (one, eight, none):
        line = lines[h.hostname]
        assert line.startswith(f"{h.hostname} ") and " amd64 " in line and " v1.4.2 " in line, line
        assert "(364 days left)" in line or "(365 days left)" in line, line  # a year's certificate
        assert f"{h.hostname}: \"{line}\"" in up.output, up.output
    assert " - " in lines[none.hostname] + " "

    # A standing problem is a warning, not a change.
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output
    assert warned(preview, missing), preview.output

    # The HCA appears (its driver loaded); refresh reads the node again and the problem is gone.
    rc, text = ssh(one, cluster, f"sudo mkdir {IB_ROOT}/mlx5_1")
    assert rc == 0, text
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    check_state = next(r["outputs"] for r in stack.export()["resources"]
                       if r["type"].endswith("EngineCheck") and r["outputs"]["node_id"] == one.hostname)
    assert check_state["problems"] == [] and check_state["inventory"]["hcas"] == ["mlx5_0", "mlx5_1"]
    # Stack outputs are the program's: the next `up` (no change, no SSH) shows what the refresh found.
    again = stack.up()
    assert again.ok and set(again.changes) == {"same"}, again.output
    assert not warned(again, missing), again.output
    assert stack.outputs()[one.hostname]["hcas"] == ["mlx5_0", "mlx5_1"]
    line = stack.outputs()["fleet"][one.hostname]
    assert "1x NVIDIA H200" in line and line.endswith("none"), line
