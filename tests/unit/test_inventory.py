"""The inventory's parsers on the real output of an H200 node, and the fleet table (both pure)."""

from __future__ import annotations

import datetime as dt

from lab.doubles.nvidia_smi import FIXTURES
from llmgw_pulumi.nodestate import commands, facts
from llmgw_pulumi.stack import fleet
from tests.unit.health_samples import UUID0, needs_fixtures


def probe_output(status: str = "ok", path: str = "/usr/bin/nvidia-smi", detail: str = "", hcas: tuple[str, ...] = ()) -> str:
    """What probe-engines.sh prints for the inventory, around the fixture's real nvidia-smi output."""
    out = f"smi\t{status}\t{path}\t{detail}\n"
    if status == "ok":
        out += "".join(f"gpu\t{row}\n" for row in (FIXTURES / "query-gpu-noheader-nounits.csv").read_text().splitlines())
        header = next(line for line in (FIXTURES / "nvidia-smi.txt").read_text().splitlines() if "CUDA Version" in line)
        out += f"smi-header\t{header}\n"
    return out + "".join(f"hca\t{h}\n" for h in hcas) + "engine\tvllm\truns\t\n"


@needs_fixtures
def test_inventory_of_a_real_h200() -> None:
    inv = facts.parse_inventory(probe_output(hcas=("mlx5_1", "mlx5_0")))
    assert inv.smi_status == "ok"
    (g,) = inv.gpus
    assert (g.index, g.name, g.memory_mib, g.uuid, g.pci_bus_id) == (0, "NVIDIA H200", 143771, UUID0, "00000000:00:06.0")
    assert (inv.driver, inv.cuda, inv.hcas) == ("580.159.04", "13.0", ("mlx5_0", "mlx5_1"))
    assert inv.as_output() == {"gpus": [{"index": 0, "name": "NVIDIA H200", "memory_mib": 143771, "uuid": UUID0,
                                         "pci_bus_id": "00000000:00:06.0", "compute_cap": "9.0"}],
                               "driver": "580.159.04", "cuda": "13.0", "hcas": ["mlx5_0", "mlx5_1"]}


@needs_fixtures
def test_the_query_the_probe_makes_is_the_one_the_fixture_was_captured_with() -> None:
    # The script asks nvidia-smi for these fields: the noheader capture has exactly these columns.
    assert commands.probe_engines(()).args[3] == ",".join(facts.INVENTORY_QUERY_FIELDS)
    row = (FIXTURES / "query-gpu-noheader-nounits.csv").read_text().split(",")
    assert len(row) == len(facts.INVENTORY_QUERY_FIELDS)
    assert facts.parse_gpu_query((FIXTURES / "query-gpu.csv").read_text()) == list(facts.parse_inventory(probe_output()).gpus)


def test_no_nvidia_smi_is_an_empty_inventory_and_no_problem() -> None:
    inv = facts.parse_inventory("smi\tnone\t\t\nengine\tvllm\truns\t\n")
    assert inv.as_output() == {"gpus": [], "driver": "", "cuda": "", "hcas": []}
    assert facts.inventory_problems(inv, [], "/sys/class/infiniband", "gpu-01", "deploy@h") == []


@needs_fixtures
def test_output_nvidia_smi_should_not_give_is_a_failure_in_its_own_words() -> None:
    bad = (FIXTURES / "query-bad-field.txt").read_text().splitlines()[0]
    inv = facts.parse_inventory(f"smi\tok\t/usr/bin/nvidia-smi\t\ngpu\t{bad}\n")
    assert inv.smi_status == "fails" and 'Field "nonsense"' in inv.smi_detail and inv.gpus == ()
    (p,) = facts.inventory_problems(inv, [], "/sys/class/infiniband", "gpu-01", "deploy@h")
    assert p["status"] == "fails" and "gpu-01" in p["problem"] and p["hint"].startswith("ssh deploy@h /usr/bin/nvidia-smi")


def test_each_missing_declared_hca_is_one_problem_naming_node_fabric_and_hca() -> None:
    inv = facts.parse_inventory("smi\tnone\t\t\nhca\tmlx5_0\n")
    problems = facts.inventory_problems(inv, [("ib-east", ["mlx5_0", "mlx5_1"]), ("ib-west", ["mlx5_2"])],
                                        "/sys/class/infiniband", "gpu-07", "deploy@10.0.0.7")
    assert [(p["fabric"], p["hca"]) for p in problems] == [("ib-east", "mlx5_1"), ("ib-west", "mlx5_2")]
    assert all("gpu-07" in p["problem"] and "(under /sys/class/infiniband: mlx5_0)" in p["problem"] for p in problems)
    assert problems[0]["hint"].startswith("ssh deploy@10.0.0.7 ls /sys/class/infiniband;")


# --------------------------------------------------------------------------- the fleet table

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
H200 = {"index": 0, "name": "NVIDIA H200", "memory_mib": 143771.0}


def test_the_fleet_output_is_one_line_per_node_its_fields_lined_up() -> None:
    rows = [
        fleet.FleetRow("gpu-07", "gpu-07.dc1", "2027-11-30T11:00:00+00:00", "v1.4.2", "amd64", [H200] * 8,
                       [{"fabric": "ib-east", "hca": "mlx5_1", "status": "missing", "problem": "...", "hint": "..."}]),
        fleet.FleetRow("cpu-1", "cpu-1", "2026-12-10T12:00:00+00:00", "v1.5.0", "arm64"),
    ]
    lines = fleet.fleet_lines(rows, NOW)
    assert list(lines) == ["gpu-07", "cpu-1"]
    assert lines["gpu-07"].split() == ["gpu-07.dc1", "cert", "2027-11-30", "11:00", "UTC", "(364", "days", "left)",
                                       "agent", "v1.4.2", "amd64", "8x", "NVIDIA", "H200", "not", "ready", "problems:", "1:", "mlx5_1",
                                       "missing"]
    assert lines["cpu-1"].split() == ["cpu-1", "cert", "2026-12-10", "12:00", "UTC", "(10", "days", "left)", "agent",
                                      "v1.5.0", "arm64", "-", "ready", "problems:", "none"]
    # Fields line up: each starts at the same column on every line, and no line is cut by the CLI (150 characters).
    for field in ("cert", "agent", "problems:"):
        assert len({line.index(field) for line in lines.values()}) == 1, (field, lines)
    assert all(len(line) <= 150 for line in lines.values())


def test_the_fleet_output_says_when_a_certificate_expired_and_counts_several_models() -> None:
    row = fleet.FleetRow("n", "h", "2026-11-29T00:00:00+00:00", "v1", "amd64",
                         [H200, {"name": "NVIDIA L40S"}, H200], [{"engine": "vllm", "status": "missing"}] * 2)
    line = fleet.fleet_lines([row], NOW)["n"]
    assert "(expired (-2))" in line and "2x NVIDIA H200, 1x NVIDIA L40S" in line and "2: vllm missing, vllm missing" in line
    assert fleet.gpu_model(row.gpus) == "NVIDIA H200 + NVIDIA L40S" and fleet.gpu_model([]) == ""


def test_an_empty_fleet_has_no_line() -> None:
    assert fleet.fleet_lines([], NOW) == {}


def test_the_nodes_output_is_a_line_of_json_per_node_a_program_reads_back() -> None:
    data = {"gpu-10": {"hostname": "gpu-10", "problems": [{"engine": "vllm"}], "gpus": 8},
            "gpu-2": {"hostname": "gpu-2\nforged", "problems": [], "gpus": 0}}
    text = fleet.nodes_lines(data)
    assert len(text.splitlines()) == 2  # a newline in a value stays inside its line, escaped
    assert fleet.read_nodes(text) == data and list(fleet.read_nodes(text)) == ["gpu-10", "gpu-2"]
    assert fleet.nodes_lines({}) == "" and fleet.read_nodes("") == {}
