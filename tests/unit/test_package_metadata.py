"""What the wheel tells the index and the user's resolver (pyproject.toml's [project]): the metadata a user reads,
and dependency ranges that are bounded at both ends and hold only what the package imports.

Both ends of each range are run by scripts/test-dependency-ranges; tests/lab/test_package.py builds the wheel and
reads its metadata back from an installed copy."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_wheel_says_what_it_is_whose_it_is_and_where_to_read_more() -> None:
    assert PROJECT["description"].strip()
    assert (REPO / PROJECT["readme"]).is_file()
    assert PROJECT["license"] and all((REPO / f).is_file() for f in PROJECT["license-files"])
    assert PROJECT["authors"] and PROJECT["maintainers"]
    assert {"Homepage", "Documentation", "Source", "Changelog"} <= set(PROJECT["urls"])
    assert all(url.startswith("https://") for url in PROJECT["urls"].values())
    assert PROJECT["requires-python"] == ">=3.11"
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers and (REPO / "llmgw_pulumi" / "py.typed").is_file()
    # A Python version is claimed only where the suite runs: the one mypy and ruff target.
    claimed = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert claimed == {"3.11"}


def ranges() -> list[Requirement]:
    extras = PROJECT["optional-dependencies"]
    return [Requirement(r) for r in [*PROJECT["dependencies"], *extras["policy"], *extras["examples"]]]


@pytest.mark.parametrize("requirement", ranges(), ids=str)
def test_every_dependency_a_user_installs_is_a_range_bounded_at_both_ends(requirement: Requirement) -> None:
    operators = {spec.operator for spec in requirement.specifier}
    assert ">=" in operators and "<" in operators, f"{requirement}: give a lower bound (>=) and an upper one (<)"


def imported_modules(package: Path) -> set[str]:
    """The top-level name of every module the package's source imports (absolute imports)."""
    found: set[str] = set()
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def test_pulumi_command_is_only_the_examples_extra_and_the_package_never_imports_it() -> None:
    base = {Requirement(r).name for r in PROJECT["dependencies"]}
    assert "pulumi-command" not in base
    assert [Requirement(r).name for r in PROJECT["optional-dependencies"]["examples"]] == ["pulumi-command"]
    imported = imported_modules(REPO / "llmgw_pulumi")
    assert {"pulumi", "cryptography", "paramiko", "yaml"} <= imported  # the scan sees the package's imports
    assert "pulumi_command" not in imported
    # What does use it: the example that boots its VM with it.
    assert "pulumi_command" in imported_modules(REPO / "examples" / "vm-command")


def test_the_import_scan_sees_every_form_of_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import pulumi_command.local as c\nfrom . import sibling\n")
    (tmp_path / "b.py").write_text("def f():\n    from pulumi_command import local\n")
    assert imported_modules(tmp_path) == {"pulumi_command"}


UNPUBLISHED = re.compile(r"llmgw-pulumi(?:\[\w+\])?(?!'s)(?!\S*\s*@\s*https://)(?=[\s\"'=<>~!]|$)")
"""A requirement on llmgw-pulumi by name from an index (the project publishes to none), not a direct URL."""


def unpublished(text: str) -> list[str]:
    """The lines of a CI file that would install llmgw-pulumi by name (comments and step names are prose)."""
    prose = re.compile(r"\s*(?:-\s*)?(?:#|name:)")
    return [line for line in text.splitlines() if not prose.match(line) and UNPUBLISHED.search(line)]


def ci_files() -> list[Path]:
    return sorted(p for p in (REPO / "examples" / "ci").rglob("*") if p.is_file())


def test_the_ci_examples_install_the_teams_own_wheel_not_a_name_from_an_index() -> None:
    files = ci_files()
    assert any(p.name == ".gitlab-ci.yml" for p in files) and any(p.suffix == ".yml" and ".github" in p.parts for p in files)
    texts = {p.relative_to(REPO): p.read_text() for p in files}
    assert [f"{p}: {line}" for p, t in texts.items() for line in unpublished(t)] == []
    # What they install instead: the program's lock, every file by its hash, which names the team's wheel by URL.
    for path, text in texts.items():
        installs = [line for line in text.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
        assert all("--require-hashes -r requirements.txt" in line for line in installs), (path, installs)
        if installs:
            assert "llmgw-pulumi[policy] @ https://" in text and "--hash=sha256:" in text, path


@pytest.mark.parametrize(("text", "found"), [
    ('LLMGW_PULUMI: llmgw-pulumi[policy]\n', True),
    ('pip install "llmgw-pulumi==0.3.0"\n', True),
    ("pip install llmgw-pulumi\n", True),
    ("#   llmgw-pulumi[policy] @ https://artifacts.example.net/llmgw_pulumi-0.3.0-py3-none-any.whl#sha256=ab\n", False),
    ("what pip installs for the package (llmgw-pulumi's wheel)\n", False),
])
def test_the_ci_scan_tells_a_name_from_a_url(text: str, found: bool) -> None:
    assert bool(unpublished(text)) is found
    assert unpublished(f"      - name: Install {text}") == [] and unpublished(f"  # {text}") == []
