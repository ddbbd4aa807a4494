"""Node list files: a stack's nodes in a YAML or CSV file that ``llmgw:inventory`` names, instead of llmgw:nodes.

(Not the GPU/HCA inventory a node reports, llmgw_pulumi.nodestate.facts: the config key is ``inventory``, the thing a
"node list file".) A rack's stack then holds one line, and the nodes are whatever the fleet's own records
export:

    # stacks/Pulumi.rack-a.yaml
    config:
      llmgw:inventory: racks/rack-a.csv        # relative to the project directory

    # racks/rack-a.csv: a header of node settings, one row per node; an empty cell is a setting not given
    id,address,hostKey,fabric.name,fabric.hcas,engines.vllm.bin
    gpu-a01,10.0.1.11,,ib-east,mlx5_0 mlx5_1,/opt/vllm/bin/vllm

A YAML file holds the list llmgw:nodes would hold (``- id: gpu-a01``...). A CSV column is a node setting,
nested ones by dotted path (``fabric.name``, ``agent.version``, ``agent.sha256.amd64``: a pin of the row's
version); ``port`` is a number (as are ``hardware.gpuCount``, ``hardware.gpuMemoryMib`` and
``hardware.hcaPorts.minRateGbps``), ``failOnEngineProblems``, ``failOnProblems`` and ``agent.allowUnverifiedRelease``
true or false, and ``servers``, ``jump`` and ``fabric.hcas`` lists separated by spaces. A row whose first cell starts
with ``#`` is a comment.

Every row is validated by stack_config.parse exactly as llmgw:nodes is (the same validators, the same
list of problems), each problem naming the file, the line and the field, together with those of the file
itself (an unknown column, a broken line) and the rest of the stack config: every problem at once, before
anything happens.

Node ids are also checked across the project's stacks, without any stack's state: every other stack
settings file in the project's stack config directory (Pulumi.<stack>.yaml beside this stack's) is read
for its llmgw:nodes and llmgw:inventory (or the project's, from Pulumi.yaml), and a node id that another
stack also lists is refused. Stacks kept elsewhere (another checkout, another directory) are not seen.

The file reading and parsing is here; program.py calls ``parse``.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import validate
from ..releases.policy import OPT_OUT_SETTING
from . import stack_config
from .schema import Schema

NAMESPACE = stack_config.NAMESPACE
CONFIG_KEY = "inventory"
"""llmgw:inventory, as the issue asked for it (the file is called a node list file here)."""
KINDS = {".yaml": "yaml", ".yml": "yaml", ".csv": "csv"}
INTEGER_COLUMNS = frozenset({"port", "hardware.gpuCount", "hardware.gpuMemoryMib"})
NUMBER_COLUMNS = frozenset({"hardware.hcaPorts.minRateGbps"})
BOOLEAN_COLUMNS = frozenset({"failOnEngineProblems", "failOnProblems", f"agent.{OPT_OUT_SETTING}"})
LIST_COLUMNS = frozenset({"servers", "jump", "fabric.hcas"})
"""CSV cells are text: these columns are read as a whole number, a number, true/false, or a list separated by
spaces. A cell that is not what its column takes is passed on as text, so the setting's own validator refuses
it. (hardware.minDriver and hardware.minCuda stay text: versions.)"""
FREE_FORM_COLUMNS = frozenset({"agent.sha256"})
"""Settings that are mappings of free keys: a CSV column may add one more part (``agent.sha256.amd64``)."""

Problem = tuple[str, str, str, str]
"""(where, field, problem, fix), as stack_config.StackConfigError lists them."""


def csv_columns(schema: Schema = stack_config.NODE_SCHEMA, prefix: str = "") -> set[str]:
    """The node settings a CSV column may name: every single value, reached through mappings only."""
    columns: set[str] = set()
    for key, sub in schema.items():
        if isinstance(sub, list):
            continue  # a list of mappings (fabrics) has no place in one row: fabric.* or a YAML file
        if sub is None:
            columns.add(prefix + key)
        else:
            columns |= csv_columns(sub, f"{prefix}{key}.")
    return columns


COLUMNS = frozenset(csv_columns())


@dataclass(frozen=True)
class NodeList:
    """The rows of one node list file, each with the line it starts on, and what is wrong with the file itself."""

    shown: str
    """The file as the stack config names it: every message uses this."""
    rows: tuple[Mapping[str, Any], ...] = ()
    lines: tuple[int, ...] = ()
    problems: tuple[Problem, ...] = ()

    @property
    def origins(self) -> list[str]:
        """Where each row is, as stack_config.parse names a node: 'racks/rack-a.csv line 3'."""
        return [self.at(line) for line in self.lines]

    def at(self, line: int) -> str:
        return f"{self.shown} line {line}"


def kind_of(name: str) -> str | None:
    """'yaml' or 'csv' by the file's suffix; None for any other."""
    return KINDS.get(Path(name).suffix.lower())


def read(text: str, shown: str, kind: str) -> NodeList:
    """A node list file's text (pure): its rows, their lines, the file's own problems."""
    return _read_csv(text, shown) if kind == "csv" else _read_yaml(text, shown)


def _column_problem(column: str) -> tuple[str, str] | None:
    """(problem, fix) of a CSV header cell that names no node setting."""
    if column in COLUMNS or column.rpartition(".")[0] in FREE_FORM_COLUMNS:
        return None
    if column.split(".")[0] == "fabrics":
        return "is a list of fabrics, which a row cannot hold", "use fabric.name and fabric.hcas, or a YAML node list file"
    if any(c.startswith(column + ".") for c in COLUMNS):
        return "holds several settings", f"give each its own column: {', '.join(sorted(c for c in COLUMNS if c.startswith(column + '.')))}"
    return "is not a node setting", validate.did_you_mean(column, COLUMNS)


def _cell(column: str, text: str) -> Any:
    if column in INTEGER_COLUMNS and text.isdigit():
        return int(text)
    if column in NUMBER_COLUMNS:
        try:
            return float(text)
        except ValueError:
            return text
    if column in BOOLEAN_COLUMNS and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if column in LIST_COLUMNS:
        return text.split()
    return text


def _nest(columns: list[str], cells: list[str]) -> dict[str, Any]:
    """One row's cells as a node's settings: dotted columns nested, empty cells left out."""
    node: dict[str, Any] = {}
    for column, text in zip(columns, cells, strict=False):
        if not column or not text.strip():
            continue
        *parents, leaf = column.split(".")
        into = node
        for part in parents:
            into = into.setdefault(part, {})
        into[leaf] = _cell(column, text.strip())
    return node


def _read_csv(text: str, shown: str) -> NodeList:
    records = _csv_records(text)
    problems: list[Problem] = []
    header = next(records, None)
    if header is None:
        return NodeList(shown, problems=(("llmgw", CONFIG_KEY, f"{shown} holds no header and no nodes",
                                          "begin it with a header such as id,address, then one row per node"),))
    header_line, header_cells = header
    columns = [cell.strip() for cell in header_cells]
    where = f"{shown} line {header_line}"
    for index, column in enumerate(columns):
        name = column or f"column {index + 1}"
        bad = (("is empty", "name every column, or remove the empty one") if not column else
               ("is given twice", "keep one column per setting") if columns.index(column) != index else
               _column_problem(column))
        if bad:
            problems.append((where, name, *bad))
    missing = [c for c in ("id", "address") if c not in columns]
    for column in missing:
        problems.append((where, column, "has no column", f"add a column {column} to the header"))
    usable = [c if c and not _column_problem(c) and columns.index(c) == i else "" for i, c in enumerate(columns)]
    rows: list[Mapping[str, Any]] = []
    lines: list[int] = []
    for line, cells in records:
        if len(cells) > len(columns):
            problems.append((f"{shown} line {line}", "cells", f"{len(cells)} given, the header has {len(columns)}",
                             "quote a value holding a comma, or remove the extra cells"))
            continue
        if not missing:
            rows.append(_nest(usable, cells))
            lines.append(line)
    return NodeList(shown, tuple(rows), tuple(lines), tuple(problems))


def _csv_records(text: str) -> Iterator[tuple[int, list[str]]]:
    """(the line a record starts on, its cells), without blank records and comments (first cell '#...')."""
    reader = csv.reader(io.StringIO(text))
    end = 0
    for cells in reader:
        start, end = end + 1, reader.line_num
        if not any(cell.strip() for cell in cells) or cells[0].lstrip().startswith("#"):
            continue
        yield start, cells


def _read_yaml(text: str, shown: str) -> NodeList:
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{shown} line {mark.line + 1}" if mark is not None else shown
        return NodeList(shown, problems=((where, "YAML", f"is not valid ({getattr(exc, 'problem', None) or exc})",
                                          "fix the YAML at that line"),))
    finally:
        loader.dispose()
    if root is None:
        return NodeList(shown)  # an empty file: no nodes
    if not isinstance(root, yaml.SequenceNode) or not isinstance(data, list):
        return NodeList(shown, problems=(("llmgw", CONFIG_KEY, f"{shown} does not hold a list of nodes",
                                          "write one entry per node: - {id: gpu-01, address: 10.0.0.11}"),))
    problems: list[Problem] = []
    for item in root.value:
        if isinstance(item, yaml.MappingNode):
            keys = [key.value for key, _ in item.value if isinstance(key, yaml.ScalarNode)]
            for key in sorted({k for k in keys if keys.count(k) > 1}):
                problems.append((f"{shown} line {item.start_mark.line + 1}", str(key), "is given twice in this node",
                                 "keep one of the two"))
    return NodeList(shown, tuple(data), tuple(item.start_mark.line + 1 for item in root.value), tuple(problems))


def load(given: Any, project_dir: Path) -> NodeList:
    """The node list file llmgw:inventory names (relative to the project directory; ~ expanded)."""
    shown = str(given)
    bad = validate.local_path(given, "path of the node list file")
    if bad:
        return NodeList(shown, problems=(("llmgw", CONFIG_KEY, *bad),))
    kind = kind_of(shown)
    if kind is None:
        return NodeList(shown, problems=(("llmgw", CONFIG_KEY, f"{shown} is neither a .yaml, .yml nor a .csv file",
                                          "name a YAML or CSV node list file by its suffix"),))
    path = project_dir / os.path.expanduser(shown)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's CSV export may begin with a byte-order mark
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return NodeList(shown, problems=(("llmgw", CONFIG_KEY, f"cannot read {path}: {reason}",
                                          "point llmgw:inventory at a readable UTF-8 file, relative to the project directory"),))
    return read(text, shown, kind)


def parse(config: Mapping[str, Any], project_dir: Path, stack: str | None = None, **kwargs: Any) -> stack_config.StackSpec:
    """stack_config.parse, with the nodes of llmgw:inventory's file when it is given; and, with ``stack``, every
    node id checked against the project's other stacks. Every problem of the file, the rows, the rest of the
    config and the other stacks at once, as one StackConfigError."""
    problems: list[Problem] = []
    origins: list[str] = []
    if CONFIG_KEY in config:
        node_list = load(config[CONFIG_KEY], project_dir)
        problems += node_list.problems
        if "nodes" in config:
            problems.append(("llmgw", CONFIG_KEY, "is given together with llmgw:nodes",
                             "keep the stack's nodes in one place: remove llmgw:nodes or llmgw:inventory"))
        elif not node_list.rows and not node_list.problems:
            problems.append(("llmgw", CONFIG_KEY, f"{node_list.shown} holds no nodes", "add one row (or entry) per node"))
        config = {**config, "nodes": list(node_list.rows)}
        origins = node_list.origins
    spec: stack_config.StackSpec | None = None
    try:
        spec = stack_config.parse(config, origins=origins, **kwargs)
    except stack_config.StackConfigError as exc:
        # Said once already, in the file's own terms.
        problems += [p for p in exc.problems if not (problems and p[:2] == ("llmgw", "nodes"))]
    if stack is not None:  # whether or not the rest is valid: every problem at once
        problems += duplicates_across_stacks(_ids(config.get("nodes")), origins, other_stacks_nodes(project_dir, stack))
    if problems:
        raise stack_config.StackConfigError(problems)
    assert spec is not None
    return spec


# --------------------------------------------------------------------------- the project's other stacks


def duplicates_across_stacks(ids: Mapping[str, int], origins: list[str],
                             others: Mapping[str, list[tuple[str, str]]]) -> list[Problem]:
    """A problem for each of this stack's node ids (-> its index) that another stack lists too (pure).
    ``others``: node id -> [(stack, where it is written)]."""
    problems: list[Problem] = []
    for node_id, index in ids.items():
        for stack, where in others.get(node_id, []):
            problems.append((f"{origins[index]} (node {node_id})" if origins else f"node {node_id}", "id",
                             f"{node_id!r} is also a node of stack {stack} ({where})",
                             "a node belongs to one stack: remove it from one of the two"))
    return problems


def _ids(nodes: Any) -> dict[str, int]:
    """Each node id given (-> the index of its first entry)."""
    ids: dict[str, int] = {}
    for i, node in enumerate(nodes if isinstance(nodes, list) else []):
        if isinstance(node, Mapping) and isinstance(node.get("id"), str):
            ids.setdefault(node["id"], i)
    return ids


def other_stacks_nodes(project_dir: Path, stack: str) -> dict[str, list[tuple[str, str]]]:
    """node id -> [(stack, where)] for every other stack settings file of the project (its llmgw:nodes, or the
    rows of its llmgw:inventory, else the project's). What cannot be read there is passed over: it is that
    stack's to report when it runs."""
    project = _yaml_file(_project_file(project_dir)) or {}
    default_inventory = _project_value(_config_of(project).get(f"{NAMESPACE}:{CONFIG_KEY}"))
    config_dir = project_dir / str(project.get("stackConfigDir") or ".")
    found: dict[str, list[tuple[str, str]]] = {}
    for settings in sorted(config_dir.glob("Pulumi.*.yaml")) + sorted(config_dir.glob("Pulumi.*.yml")):
        other = settings.name.split(".", 1)[1].rsplit(".", 1)[0]
        if other == stack:
            continue
        config = _config_of(_yaml_file(settings) or {})
        nodes = config.get(f"{NAMESPACE}:nodes")
        inventory = config.get(f"{NAMESPACE}:{CONFIG_KEY}", default_inventory)
        entries: list[tuple[Any, str]] = []
        if isinstance(nodes, list):
            shown = str(settings.relative_to(project_dir))
            entries = [(node, f"{shown}, nodes[{i}]") for i, node in enumerate(nodes)]
        elif isinstance(inventory, str):
            listed = load(inventory, project_dir)
            entries = list(zip(listed.rows, listed.origins, strict=True))
        for node, where in entries:
            if isinstance(node, Mapping) and isinstance(node.get("id"), str):
                found.setdefault(node["id"], []).append((other, where))
    return found


def _project_file(project_dir: Path) -> Path:
    yml = project_dir / "Pulumi.yml"
    return yml if yml.exists() and not (project_dir / "Pulumi.yaml").exists() else project_dir / "Pulumi.yaml"


def _project_value(declared: Any) -> Any:
    """A project-level config entry's value: ``{value: ...}`` or ``{default: ...}``, or a plain value."""
    if isinstance(declared, Mapping):
        return declared.get("value", declared.get("default"))
    return declared


def _config_of(settings: Mapping[str, Any]) -> Mapping[str, Any]:
    config = settings.get("config")
    return config if isinstance(config, Mapping) else {}


def _yaml_file(path: Path) -> Mapping[str, Any] | None:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return data if isinstance(data, Mapping) else None

