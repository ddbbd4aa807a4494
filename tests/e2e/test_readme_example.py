"""The README's production example works as written: its stack file, taken from README.md by a CommonMark parser,
saved as a new stack beside the shipped ones (stacks/Pulumi.local.yaml), previews under the `pulumi` CLI with
every node it lists planned, in an operator's home directory that holds nothing yet (no SSH key).

A preview reaches no node: the example's addresses are never contacted."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown_it import MarkdownIt

from lab.stack import REPO, LabStack, engine_bin, engine_env

pytestmark = pytest.mark.engine

HEADER = "# stacks/Pulumi.prod.yaml\n"
"""The first line of the README's example: it names the file the example is saved as."""


def readme_example() -> str:
    fences = [t for t in MarkdownIt("commonmark").parse((REPO / "README.md").read_text()) if t.type == "fence"]
    examples = [t.content for t in fences if t.info.strip() == "yaml" and t.content.startswith(HEADER)]
    assert len(examples) == 1, f"README.md should hold one YAML block starting {HEADER!r}, has {len(examples)}"
    return examples[0]


def preview(tmp_path: Path, stack_file: str) -> tuple[LabStack, Any]:
    """The example saved as stacks/Pulumi.prod.yaml in a copy of this project beside its shipped stacks, previewed."""
    work = tmp_path / "project"
    shutil.copytree(REPO / "stacks", work / "stacks")
    (work / "stacks" / "Pulumi.prod.yaml").write_text(stack_file)
    env = engine_env(engine_bin(), tmp_path / "pulumi-home", tmp_path / "state")
    home = tmp_path / "operator"
    home.mkdir()
    env["HOME"] = str(home)
    stack = LabStack(work, "prod", env, project=REPO)
    return stack, stack.preview()


def planned_nodes(run: Any) -> set[str]:
    """The ids of the `Node` components the preview would create."""
    metas = [(e.get("resourcePreEvent") or {}).get("metadata") or {} for e in run.events]
    return {m["urn"].rsplit("::", 1)[1] for m in metas if m.get("type") == "llmgw:index:Node" and m.get("op") == "create"}


def test_the_readme_example_previews_as_written_beside_the_shipped_stacks(tmp_path: Path) -> None:
    text = readme_example()
    nodes = [n["id"] for n in yaml.safe_load(text)["config"]["llmgw:nodes"]]
    assert len(nodes) >= 3, nodes
    stack, run = preview(tmp_path, text)
    assert run.ok, run.output
    assert (stack.work_dir / "stacks" / "Pulumi.local.yaml").is_file()  # the shipped stack was beside it
    assert planned_nodes(run) == set(nodes), run.output
    assert run.diagnostics("error") == [], run.output


def test_a_node_of_a_shipped_stack_in_the_example_fails_its_preview(tmp_path: Path) -> None:
    # The control: the preview above would have seen a clash with the shipped `local` stack.
    local = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())["config"]["llmgw:nodes"]
    text = readme_example()
    last, clash = yaml.safe_load(text)["config"]["llmgw:nodes"][-1]["id"], local[-1]["id"]
    _, run = preview(tmp_path, text.replace(f"id: {last}\n", f"id: {clash}\n"))
    assert not run.ok
    errors = "\n".join(d["message"] for d in run.diagnostics("error"))
    assert f"node {clash}: id:" in errors and "stacks/Pulumi.local.yaml" in errors and "fix:" in errors, run.output
