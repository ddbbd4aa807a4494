"""Node list files (llmgw:inventory): YAML or CSV rows validated as llmgw:nodes is, every problem naming the file,
the line and the field, all at once; node ids checked across the project's stack files."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from llmgw_pulumi.config import node_list, stack_config
from llmgw_pulumi.config.stack_config import StackConfigError
from tests.unit import RELEASE_KEY

HOST_KEY = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
    serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
TOP: dict[str, Any] = {
    "pkiDir": "/srv/llmgw/pki",
    "servers": ["cp1.example.net:7443"],
    "agent": {"version": "v1.4.2", "signingKey": RELEASE_KEY, "releaseUrl": "https://releases.example.net/llmgw"},
    "ssh": {"user": "deploy", "privateKeyPath": "/home/op/.ssh/id_ed25519"},
}

NODES: list[dict[str, Any]] = [
    {"id": "gpu-01", "address": "10.0.0.11"},
    {"id": "gpu-02", "address": "10.0.0.12", "port": 2222, "hostKey": HOST_KEY,
     "fabric": {"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]},
     "engines": {"vllm": {"bin": "/opt/vllm/bin/vllm"}}, "failOnEngineProblems": True,
     "agent": {"version": "v1.5.0"}, "servers": ["cp2.example.net:7443", "cp3.example.net:7443"],
     "keyOrigin": "operator", "discovery": {"nvidiaSmi": "/opt/nvidia/bin/nvidia-smi"}},
]
CSV = textwrap.dedent("""\
    id,address,port,hostKey,fabric.name,fabric.hcas,engines.vllm.bin,failOnEngineProblems,agent.version,servers,keyOrigin,discovery.nvidiaSmi
    # rack A, row 1
    gpu-01,10.0.0.11,,,,,,,,,,

    gpu-02, 10.0.0.12 ,2222,{key},ib-east,mlx5_0 mlx5_1,/opt/vllm/bin/vllm,true,v1.5.0,{servers},operator,{smi}
    """).format(key=HOST_KEY, servers="cp2.example.net:7443 cp3.example.net:7443", smi="/opt/nvidia/bin/nvidia-smi")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def problems_of(config: dict[str, Any], project: Path, stack: str | None = None) -> list[tuple[str, str, str, str]]:
    with pytest.raises(StackConfigError) as caught:
        node_list.parse(config, project, stack)
    return caught.value.problems


# --------------------------------------------------------------------------- the same nodes as llmgw:nodes


@pytest.mark.parametrize("name", ["rack.csv", "rack.yaml", "rack.YML"])
def test_a_node_list_file_gives_the_stack_exactly_the_nodes_llmgw_nodes_would(tmp_path, name):
    text = CSV if name.endswith(".csv") else yaml.safe_dump(NODES)
    write(tmp_path, name, text)
    from_file = node_list.parse({**TOP, "inventory": name}, tmp_path)
    inline = stack_config.parse({**TOP, "nodes": copy.deepcopy(NODES)})
    assert from_file == inline
    assert from_file.nodes[1].connection.port == 2222 and from_file.nodes[1].fail_on_engine_problems is True
    assert [f.hcas for f in from_file.nodes[1].settings.fabrics] == [("mlx5_0", "mlx5_1")]


def test_without_llmgw_inventory_the_stack_config_is_parsed_as_before(tmp_path):
    assert node_list.parse({**TOP, "nodes": NODES}, tmp_path) == stack_config.parse({**TOP, "nodes": NODES})


BAD_ROWS = [
    # (CSV cells after id,address / YAML node, field named)
    ({"port": "x22"}, "port"),
    ({"port": "0"}, "port"),
    ({"address": "10.0.0.300"}, "address"),
    ({"id": "GPU_01"}, "id"),
    ({"fabric.hcas": "mlx5_0"}, "fabric.name"),
    ({"failOnEngineProblems": "maybe"}, "failOnEngineProblems"),
    ({"keyOrigin": "cloud"}, "keyOrigin"),
    ({"hostKey": "ssh-ed25519 short"}, "hostKey"),
    ({"engines.vllm.bin": "relative/vllm"}, "engines.vllm.bin"),
    ({"agent.version": "latest"}, "agent.binary"),
    ({"agent.sha256.amd64": "not-hex"}, "agent.sha256"),
    ({"servers": "cp1.example.net"}, "servers[0]"),
]


def _csv_of(rows: list[dict[str, str]]) -> str:
    columns = sorted({c for row in rows for c in row} | {"id", "address"}, key=lambda c: (c not in ("id", "address"), c))
    lines = [",".join(columns)] + [",".join(row.get(c, "") for c in columns) for row in rows]
    return "\n".join(lines) + "\n"


def test_bad_rows_get_the_problems_and_fixes_llmgw_nodes_gets_each_naming_file_line_and_field(tmp_path):
    rows = [{"id": f"gpu-{i:02}", "address": f"10.0.0.{i + 10}", **cells} for i, (cells, _) in enumerate(BAD_ROWS)]
    write(tmp_path, "racks/rack-a.csv", _csv_of(rows))
    from_file = problems_of({**TOP, "inventory": "racks/rack-a.csv"}, tmp_path)
    # The same rows as llmgw:nodes, typed as a stack file would type them.
    inline_nodes = node_list.read(_csv_of(rows), "x.csv", "csv").rows
    with pytest.raises(StackConfigError) as inline:
        stack_config.parse({**TOP, "nodes": list(inline_nodes)})
    assert [p[1:] for p in from_file] == [p[1:] for p in inline.value.problems]
    # Every bad row reported, at once, each by its line (the header is line 1) and its field.
    assert len(from_file) == len(BAD_ROWS)
    for line, ((_, field), (where, name, _, fix)) in enumerate(zip(BAD_ROWS, from_file, strict=True), start=2):
        assert where.startswith(f"racks/rack-a.csv line {line}"), (where, field)
        assert name == field and fix
    text = str(StackConfigError(from_file))
    assert "racks/rack-a.csv line 2 (node gpu-00): port: 'x22' is not a TCP port" in text


def test_file_problems_row_problems_and_the_rest_of_the_config_come_in_one_list(tmp_path):
    write(tmp_path, "rack.csv", "id,adress,address,address,fabrics,fabric\n"
                                "gpu-01,,10.0.0.11,,,\n"
                                "gpu-01,,10.0.0.12\n"
                                "gpu-03,,10.0.0.13,,,,,\n")
    problems = problems_of({**TOP, "servers": [], "inventory": "rack.csv"}, tmp_path)
    found = {(where, name, problem.split(" (")[0]) for where, name, problem, _ in problems}
    assert found == {
        ("rack.csv line 1", "adress", "is not a node setting"),
        ("rack.csv line 1", "address", "is given twice"),
        ("rack.csv line 1", "fabrics", "is a list of fabrics, which a row cannot hold"),
        ("rack.csv line 1", "fabric", "holds several settings"),
        ("rack.csv line 4", "cells", "8 given, the header has 6"),
        ("llmgw", "servers", "is empty or missing"),
        ("rack.csv line 3 (node gpu-01)", "id", "'gpu-01' is used by rack.csv line 2 too"),
    }, problems
    assert next(fix for _, name, _, fix in problems if name == "adress") == "did you mean address?"


def test_lines_are_those_of_the_file_past_comments_blank_lines_and_quoted_newlines(tmp_path):
    text = 'id,address,hostKey\n\n# comment, with a comma\ngpu-01,10.0.0.11,"two\nlines"\ngpu-02,bad address,\n'
    listed = node_list.read(text, "f.csv", "csv")
    assert listed.lines == (4, 6)
    problems = problems_of({**TOP, "inventory": "f.csv"}, Path(write(tmp_path, "f.csv", text)).parent)
    assert [(where, name) for where, name, _, _ in problems] == [
        ("f.csv line 4 (node gpu-01)", "hostKey"), ("f.csv line 6 (node gpu-02)", "address")]


def test_a_csv_without_an_id_or_address_column_is_refused_once_not_for_every_row(tmp_path):
    write(tmp_path, "f.csv", "name,addr\n" + "".join(f"gpu-{i},10.0.0.{i}\n" for i in range(50)))
    problems = problems_of({**TOP, "inventory": "f.csv"}, tmp_path)
    assert [(where, name, problem) for where, name, problem, _ in problems if problem == "has no column"] == [
        ("f.csv line 1", "id", "has no column"), ("f.csv line 1", "address", "has no column")]
    assert len(problems) == 4  # and the two unknown columns


def test_yaml_rows_are_named_by_their_line_and_keys_given_twice_are_refused(tmp_path):
    write(tmp_path, "rack.yaml", "# rack B\n- id: gpu-01\n  address: 10.0.0.11\n"
                                 "- id: gpu-02\n  address: 10.0.0.12\n  port: 22\n  port: 23\n"
                                 "- {id: gpu-03, adress: 10.0.0.13}\n")
    problems = problems_of({**TOP, "inventory": "rack.yaml"}, tmp_path)
    assert [(where, name, problem) for where, name, problem, _ in problems] == [
        ("rack.yaml line 4", "port", "is given twice in this node"),
        ("rack.yaml line 8 (node gpu-03)", "adress", "is not a node setting"),
        ("rack.yaml line 8 (node gpu-03)", "address", "is missing"),
    ]


@pytest.mark.parametrize(("name", "text", "where", "field", "words"), [
    ("f.yaml", "- id: gpu-01\n  address: [10.0.0.1\n", "f.yaml line 3", "YAML", "is not valid"),
    ("f.yaml", "nodes:\n  - id: gpu-01\n", "llmgw", "inventory", "does not hold a list of nodes"),
    ("f.yaml", "", "llmgw", "inventory", "holds no nodes"),
    ("f.csv", "", "llmgw", "inventory", "holds no header and no nodes"),
    ("f.csv", "id,address\n# none yet\n", "llmgw", "inventory", "holds no nodes"),
    ("f.txt", "id,address\ngpu-01,10.0.0.1\n", "llmgw", "inventory", "neither a .yaml, .yml nor a .csv file"),
])
def test_a_file_that_holds_no_usable_list_says_so_by_itself(tmp_path, name, text, where, field, words):
    write(tmp_path, name, text)
    problems = problems_of({**TOP, "inventory": name}, tmp_path)
    assert len(problems) == 1, problems
    assert problems[0][:2] == (where, field) and words in problems[0][2], problems


def test_a_missing_file_and_nodes_given_twice_are_refused_with_the_rest(tmp_path):
    problems = problems_of({**TOP, "pkiDir": "relative", "inventory": "racks/none.csv", "nodes": NODES}, tmp_path)
    assert [(where, name) for where, name, _, _ in problems] == [("llmgw", "inventory"), ("llmgw", "inventory"),
                                                                 ("llmgw", "pkiDir")]
    assert f"cannot read {tmp_path}/racks/none.csv: No such file or directory" in problems[0][2]
    assert "together with llmgw:nodes" in problems[1][2]


def test_a_spreadsheets_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    (tmp_path / "export.csv").write_bytes("id,address\ngpu-01,10.0.0.11\n".encode("utf-8-sig"))
    assert [n.node_id for n in node_list.parse({**TOP, "inventory": "export.csv"}, tmp_path).nodes] == ["gpu-01"]


def test_the_path_may_use_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path, "fleet/a.csv", "id,address\ngpu-01,10.0.0.11\n")
    assert [n.node_id for n in node_list.parse({**TOP, "inventory": "~/fleet/a.csv"}, Path("/nonexistent")).nodes] == ["gpu-01"]


def test_every_typed_column_is_a_column():
    assert node_list.INTEGER_COLUMNS | node_list.BOOLEAN_COLUMNS | node_list.LIST_COLUMNS <= node_list.COLUMNS
    assert {"id", "address", "fabric.name", "engines.sglang.python", "agent.releaseUrl"} <= node_list.COLUMNS
    assert not {c for c in node_list.COLUMNS if c.startswith("fabrics")}


# --------------------------------------------------------------------------- across the project's stacks


def project(tmp_path: Path, stacks: dict[str, dict[str, Any]], project_config: dict[str, Any] | None = None) -> Path:
    write(tmp_path, "Pulumi.yaml", yaml.safe_dump({"name": "racks", "runtime": "python", "stackConfigDir": "stacks",
                                                   **({"config": project_config} if project_config else {})}))
    for stack, config in stacks.items():
        write(tmp_path, f"stacks/Pulumi.{stack}.yaml", yaml.safe_dump({"config": config}))
    return tmp_path


def test_a_node_id_another_stack_of_the_project_lists_is_refused_naming_that_stack_and_line(tmp_path):
    write(tmp_path, "racks/a.csv", "id,address\ngpu-01,10.0.0.11\ngpu-02,10.0.0.12\n")
    write(tmp_path, "racks/b.csv", "id,address\ngpu-20,10.0.1.20\n# moved from rack a, not taken off it:\ngpu-02,10.0.1.12\n")
    project(tmp_path, {"rack-a": {"llmgw:inventory": "racks/a.csv"}, "rack-b": {"llmgw:inventory": "racks/b.csv"},
                       "rack-c": {"llmgw:nodes": [{"id": "gpu-30", "address": "10.0.2.30"},
                                                  {"id": "gpu-01", "address": "10.0.2.31"}]}})
    problems = problems_of({**TOP, "inventory": "racks/a.csv"}, tmp_path, "rack-a")
    assert [(where, name, problem) for where, name, problem, _ in problems] == [
        ("racks/a.csv line 2 (node gpu-01)", "id", "'gpu-01' is also a node of stack rack-c (stacks/Pulumi.rack-c.yaml, nodes[1])"),
        ("racks/a.csv line 3 (node gpu-02)", "id", "'gpu-02' is also a node of stack rack-b (racks/b.csv line 4)"),
    ]
    assert problems[0][3] == "a node belongs to one stack: remove it from one of the two"
    # Alongside the stack's other problems, not after they are fixed.
    problems = problems_of({**TOP, "servers": [], "nodes": [{"id": "gpu-20", "address": "bad address"}]}, tmp_path, "rack-x")
    assert [(where, name) for where, name, _, _ in problems] == [("llmgw", "servers"), ("node gpu-20", "address"),
                                                                 ("node gpu-20", "id")]
    # Inline nodes are checked the same way, from their side.
    problems = problems_of({**TOP, "nodes": [{"id": "gpu-01", "address": "10.0.2.31"}]}, tmp_path, "rack-c")
    assert [(where, problem) for where, _, problem, _ in problems] == [
        ("node gpu-01", "'gpu-01' is also a node of stack rack-a (racks/a.csv line 2)")]


def test_stacks_with_their_own_nodes_pass_and_broken_other_stacks_are_theirs_to_report(tmp_path):
    write(tmp_path, "racks/a.csv", "id,address\ngpu-01,10.0.0.11\n")
    write(tmp_path, "racks/b.csv", "id,address,bogus\ngpu-20,10.0.1.20,x\n")
    project(tmp_path, {"rack-a": {"llmgw:inventory": "racks/a.csv"}, "rack-b": {"llmgw:inventory": "racks/b.csv"},
                       "rack-c": {"llmgw:inventory": "racks/missing.csv"}})
    write(tmp_path, "stacks/Pulumi.rack-d.yaml", "config: [not, a, mapping\n")
    spec = node_list.parse({**TOP, "inventory": "racks/a.csv"}, tmp_path, "rack-a")
    assert [n.node_id for n in spec.nodes] == ["gpu-01"]
    # gpu-20 is seen in rack-b's file despite its unknown column.
    problems = problems_of({**TOP, "nodes": [{"id": "gpu-20", "address": "10.0.9.1"}]}, tmp_path, "rack-x")
    assert [problem for _, _, problem, _ in problems] == ["'gpu-20' is also a node of stack rack-b (racks/b.csv line 2)"]


def test_a_stack_without_its_own_list_is_counted_with_the_projects(tmp_path):
    write(tmp_path, "all.yaml", "- {id: gpu-01, address: 10.0.0.11}\n")
    project(tmp_path, {"rack-a": {}, "rack-b": {"llmgw:ssh": {"wait": 5}}},
            project_config={"llmgw:inventory": {"value": "all.yaml"}})
    problems = problems_of({**TOP, "inventory": "all.yaml"}, tmp_path, "rack-a")
    assert [problem for _, _, problem, _ in problems] == ["'gpu-01' is also a node of stack rack-b (all.yaml line 1)"]
    # Without a stack name (a program that is not a stack of this project), nothing is compared.
    assert node_list.parse({**TOP, "inventory": "all.yaml"}, tmp_path).nodes[0].node_id == "gpu-01"
