"""The declared hardware and the readiness gate (issue 38, item 1): one declaration each, in the stack config
(llmgw:hardware, a node's hardware, llmgw:failOnProblems), node list files and NodeArgs; bad values refused with
the node, the field and a fix."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw_pulumi.config import node_list, stack_config
from llmgw_pulumi.config.specs import EngineCheckSpec, Fabric, Hardware, HcaPorts
from llmgw_pulumi.config.stack_config import StackConfigError
from llmgw_pulumi.errors import ConfigError
from llmgw_pulumi.health.readiness import Expectations, HcaExpectation
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.stack.node import check_node_args, node_settings
from tests.unit import RELEASE_KEY, with_value
from tests.unit.fake_node_resources import CONN, HOST_KEY
from tests.unit.good_configs import good_node_args

GOOD: dict[str, Any] = {
    "pkiDir": "/srv/llmgw/pki",
    "servers": ["cp1.example.net:7443"],
    "agent": {"version": "v1.4.2", "signingKey": RELEASE_KEY, "releaseUrl": "https://releases.example.net/llmgw"},
    "ssh": {"user": "deploy", "privateKeyPath": "/home/op/.ssh/id_ed25519"},
    "hardware": {"gpuCount": 8, "gpuModel": "NVIDIA H200", "minDriver": "570", "hcaPorts": {"minRateGbps": 400}},
    "failOnProblems": True,
    "nodes": [
        {"id": "gpu-01", "address": "10.0.0.11", "fabric": {"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}},
        {"id": "gpu-02", "address": "10.0.0.12", "hardware": {"gpuCount": 4, "minCuda": "12.8"},
         "failOnProblems": False},
        {"id": "gpu-03", "address": "10.0.0.13"},
    ],
}


def test_a_node_takes_the_stacks_hardware_and_overrides_it_setting_by_setting() -> None:
    one, two, three = stack_config.parse(GOOD).nodes
    stack = Hardware(gpu_count=8, gpu_model="NVIDIA H200", min_driver="570", hca_ports=HcaPorts(min_rate_gbps=400.0))
    assert one.hardware == stack and three.hardware == stack
    assert two.hardware == Hardware(gpu_count=4, gpu_model="NVIDIA H200", min_driver="570", min_cuda="12.8",
                                    hca_ports=HcaPorts(min_rate_gbps=400.0))
    assert [n.fail_on_critical_problems for n in (one, two, three)] == [True, False, True]


def test_without_any_declaration_a_node_has_none() -> None:
    config = {k: v for k, v in GOOD.items() if k not in ("hardware", "failOnProblems")}
    config["nodes"] = [{"id": "gpu-01", "address": "10.0.0.11"}]
    (node,) = stack_config.parse(config).nodes
    assert node.hardware is None and node.fail_on_critical_problems is None


def test_the_expectations_hold_each_hca_of_the_nodes_fabrics_only_when_ports_are_declared() -> None:
    fabrics = (Fabric("ib-east", ("mlx5_0", "mlx5_1")), Fabric("ib-west", ("mlx5_1", "mlx5_2")))
    declared = Hardware(gpu_count=8, hca_ports=HcaPorts(state="ACTIVE", min_rate_gbps=400.0))
    assert declared.expectations(fabrics) == Expectations(gpu_count=8, hcas=(
        HcaExpectation("mlx5_0", "ACTIVE", 400.0), HcaExpectation("mlx5_1", "ACTIVE", 400.0),
        HcaExpectation("mlx5_2", "ACTIVE", 400.0)))
    assert Hardware(gpu_count=8).expectations(fabrics).hcas == ()


BAD = [
    (("hardware", "gpuCount"), -1, "llmgw", "hardware.gpuCount"),
    (("hardware", "gpuCount"), 2.5, "llmgw", "hardware.gpuCount"),
    (("hardware", "gpuModel"), "", "llmgw", "hardware.gpuModel"),
    (("hardware", "gpuModel"), "NVIDIA\nH200", "llmgw", "hardware.gpuModel"),
    (("hardware", "gpuMemoryMib"), 0, "llmgw", "hardware.gpuMemoryMib"),
    (("hardware", "minDriver"), "v550", "llmgw", "hardware.minDriver"),
    (("hardware", "minCuda"), 12.8, "llmgw", "hardware.minCuda"),
    (("hardware", "hcaPorts"), {"state": "UP"}, "llmgw", "hardware.hcaPorts.state"),
    (("hardware", "hcaPorts"), {"minRateGbps": -400}, "llmgw", "hardware.hcaPorts.minRateGbps"),
    (("hardware", "hcaPorts"), {"rate": 400}, "llmgw", "hardware.hcaPorts.rate"),
    (("hardware", "gpus"), 8, "llmgw", "hardware.gpus"),
    (("hardware",), "8x H200", "llmgw", "hardware"),
    (("failOnProblems",), "yes", "llmgw", "failOnProblems"),
    (("nodes", 1, "hardware", "gpuCount"), "eight", "node gpu-02", "hardware.gpuCount"),
    (("nodes", 1, "failOnProblems"), 1, "node gpu-02", "failOnProblems"),
]


@pytest.mark.parametrize(("path", "value", "node", "field"), BAD, ids=[".".join(map(str, b[0])) + f"={b[1]!r}" for b in BAD])
def test_a_bad_declaration_is_refused_naming_the_node_the_field_and_a_fix(path: tuple[Any, ...], value: Any, node: str,
                                                                          field: str) -> None:
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(with_value(GOOD, path, value))
    found = [p for p in err.value.problems if p[:2] == (node, field)]
    assert len(found) == 1, err.value.problems
    assert found[0][3], "a fix"
    assert len(err.value.problems) == 1, err.value.problems


def test_a_node_list_file_declares_hardware_in_typed_columns() -> None:
    text = ("id,address,hardware.gpuCount,hardware.gpuMemoryMib,hardware.minCuda,hardware.hcaPorts.minRateGbps,"
            "failOnProblems\ngpu-01,10.0.0.11,8,143771,12.8,400,true\ngpu-02,10.0.0.12,eight,,12,,maybe\n")
    rows = node_list.read(text, "rack.csv", "csv")
    assert rows.problems == ()
    assert rows.rows[0]["hardware"] == {"gpuCount": 8, "gpuMemoryMib": 143771, "minCuda": "12.8",
                                        "hcaPorts": {"minRateGbps": 400.0}}
    assert rows.rows[0]["failOnProblems"] is True
    config = {k: v for k, v in GOOD.items() if k != "nodes"}
    with pytest.raises(StackConfigError) as err:
        stack_config.parse({**config, "nodes": list(rows.rows)}, origins=rows.origins)
    assert {p[:2] for p in err.value.problems} == {("rack.csv line 3 (node gpu-02)", "hardware.gpuCount"),
                                                   ("rack.csv line 3 (node gpu-02)", "failOnProblems")}
    assert all(p[3] for p in err.value.problems)


def test_node_args_declare_the_same_settings_and_are_checked_the_same_way() -> None:
    assert check_node_args(good_node_args(hardware=Hardware(gpu_count=8, min_cuda="12.8"), fail_on_critical_problems=True)) == []
    found = check_node_args(good_node_args(hardware=Hardware(gpu_count=-1, hca_ports=HcaPorts(state="UP")),  # type: ignore[arg-type]
                                  fail_on_critical_problems="yes"))
    assert all(isinstance(e, ConfigError) and e.node == "gpu-01" and e.fix for e in found)
    assert [e.field for e in found] == ["hardware.gpu_count", "hardware.hca_ports.state", "fail_on_critical_problems"]


def test_each_setting_is_described_once_with_its_doc() -> None:
    described = {".".join(s.path): s for s in node_settings()}
    for path, key in (("hardware", "hardware"), ("hardware.gpu_count", "gpuCount"), ("hardware.gpu_model", "gpuModel"),
                      ("hardware.gpu_memory_mib", "gpuMemoryMib"), ("hardware.min_driver", "minDriver"),
                      ("hardware.min_cuda", "minCuda"), ("hardware.hca_ports.state", "state"),
                      ("hardware.hca_ports.min_rate_gbps", "minRateGbps"),
                      ("fail_on_critical_problems", "failOnProblems")):
        assert described[path].config_key == key and described[path].doc, path
    assert "hardware" in stack_config.NODE_SCHEMA and "hardware" in stack_config.SCHEMA
    assert "failOnProblems" in stack_config.NODE_SCHEMA and "failOnProblems" in stack_config.SCHEMA


def test_the_provider_refuses_bad_hardware_inputs_by_field() -> None:
    with pytest.raises(ConfigError) as err:
        EngineCheckSpec.from_props({"node_id": "gpu-01", "connection": CONN, "hardware": {"min_driver": "latest"}})
    assert (err.value.node, err.value.field) == ("gpu-01", "hardware.min_driver") and err.value.fix


def test_an_existing_checks_inputs_gain_no_new_key_so_an_upgrade_is_no_change() -> None:
    p = EngineCheckProvider()
    news = {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY, "engines": {}}
    checked = p.check({}, news).inputs
    assert "hardware" not in checked and "fail_on_critical_problems" not in checked
    stored = {**checked, "problems": [], "engines_ok": True, "inventory": {}}
    assert p.diff("gpu-01", stored, checked).changes is False
    # A declaration given later is a change (the verdict is made again, on the node's next probe).
    assert p.diff("gpu-01", stored, {**checked, "hardware": {"gpu_count": 8}}).changes is True
    assert p.diff("gpu-01", stored, {**checked, "fail_on_critical_problems": True}).changes is True


def test_a_readiness_problem_is_a_standing_problem_of_the_pr_summary_with_its_severity_and_fix() -> None:
    from llmgw_pulumi.preview import cli
    from llmgw_pulumi.preview.markdown import markdown
    from tests.unit.review_previews import NOW, preview

    data = preview()
    found = {"check": "row-remap-pending", "subject": "GPU 3 (GPU-65de, 00000000:00:09.0)", "severity": "critical",
             "found": "a row remap pending", "expected": "none pending",
             "problem": "GPU 3 (GPU-65de, 00000000:00:09.0) on node14: a row remap pending; expected none pending",
             "hint": "the remap takes effect at the next reset: stop what runs on GPU 3, then reset it: "
                     "ssh deploy@10.0.0.9 sudo nvidia-smi -r -i 3 (or reboot node14)"}
    for step in data["steps"]:  # the check's state as the preview's refresh read it
        if step["urn"].endswith("EngineCheck::node14"):
            for state in (step.get("oldState"), step.get("newState")):
                if state:
                    state["outputs"]["problems"].append(found)
    node = cli.review(data, NOW).nodes["node14"]
    assert node.problems[-1] == f"critical: {found['problem']} (fix: {found['hint']})"
    text = markdown(cli.review(data, NOW))
    standing = text[text.index("**Standing problems:**"):]
    assert "critical: GPU 3 (GPU-65de, 00000000:00:09.0) on node14: a row remap pending" in standing
    assert "sudo nvidia-smi -r -i 3" in standing


def test_the_fleet_table_shows_each_nodes_readiness_and_its_problems_by_gpu_or_port() -> None:
    import datetime as dt

    from llmgw_pulumi.stack import fleet

    remap = {"check": "row-remap-pending", "subject": "GPU 3 (GPU-65de, 00000000:00:09.0)", "severity": "critical"}
    port = {"check": "ib-phys-state", "subject": "mlx5_1 port 1", "severity": "critical"}
    slow = {"check": "clock-slowdown", "subject": "GPU 0 (GPU-65dd, 00000000:00:06.0)", "severity": "warning"}
    engine = {"engine": "vllm", "status": "missing", "problem": "...", "hint": "..."}  # recorded before severities
    rows = [fleet.FleetRow("gpu-01", "gpu-01", "", "v1", "amd64"),
            fleet.FleetRow("gpu-02", "gpu-02", "", "v1", "amd64", problems=[remap, port]),
            fleet.FleetRow("gpu-03", "gpu-03", "", "v1", "amd64", problems=[slow]),
            fleet.FleetRow("gpu-04", "gpu-04", "", "v1", "amd64", problems=[engine])]
    lines = fleet.fleet_lines(rows, dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    at = {line.index("problems:") for line in lines.values()}
    assert len(at) == 1  # the fields line up
    col = at.pop()
    readiness = [line[:col].rstrip().rsplit("  ", 1)[-1].strip() for line in lines.values()]
    assert readiness == ["ready", "not ready", "degraded", "not ready"]
    assert lines["gpu-02"].endswith("2: GPU 3 row-remap-pending, mlx5_1 port 1 ib-phys-state")
    assert lines["gpu-04"].endswith("1: vllm missing")


def test_the_benchmark_section_of_the_verdict_is_replaced_in_place_and_kept_by_a_new_render() -> None:
    from bench import readiness as bench

    median, worst, size = bench.per_node(8, repeats=1)  # asserts that the real, healthy report has no problem
    assert 0 < median <= worst and size > 8 * 20_000
    page = "# Benchmark\n\n## Results\n\nold\n"
    first = bench.replace_section(page, f"{bench.SECTION_BEGIN}\none\n{bench.SECTION_END}\n")
    second = bench.replace_section(first, f"{bench.SECTION_BEGIN}\ntwo\n{bench.SECTION_END}\n")
    assert second.count(bench.SECTION_BEGIN) == 1 and "two" in second and "one" not in second
    assert second.startswith(page.rstrip("\n"))
    assert bench.kept_section(second) == f"{bench.SECTION_BEGIN}\ntwo\n{bench.SECTION_END}\n"
    assert bench.kept_section(page) == ""
