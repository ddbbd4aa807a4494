"""The tests' shape: no test module imports another (what tests share lives in helper modules named for what they
hold, and fixtures in conftest.py), and the benchmark and the lab it runs on import nothing from the tests.

Each file is parsed with ``ast``, so an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]



def imported(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, module) of each module an import in ``source`` (a module of ``package``) may load: relative imports
    resolved, and for ``from M import x`` both M and M.x (x may be a module)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def python_files(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def is_test_module(module: str) -> bool:
    return module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")


def imports_of_test_modules(folder: str) -> set[tuple[str, str]]:
    """(file, test module) for each test module a file under ``folder`` imports (a helper module must not either)."""
    found = set()
    for path in python_files(folder):
        package = module_of(path).rsplit(".", 1)[0]
        for _, module in imported(path.read_text(), package):
            if is_test_module(module) and module != module_of(path):
                found.add((str(path.relative_to(REPO)), module))
    return found


@pytest.mark.parametrize("line", [
    "from tests.unit.test_x import helper", "from .test_x import helper", "from tests.unit import test_x",
    "import tests.unit.test_x", "from . import test_x", "def f():\n    from tests.unit.test_x import helper"])
def test_each_way_of_importing_a_test_module_is_found(line: str) -> None:
    """The positive control of the checks below, one line per way of writing the import."""
    assert "tests.unit.test_x" in {module for _, module in imported(line, "tests.unit")}
    assert [m for _, m in imported("from tests.unit.fakes import fake_pem\nimport pytest\n", "tests.unit")
            if is_test_module(m)] == []


def test_no_test_module_imports_another() -> None:
    found = imports_of_test_modules("tests")
    assert not found, ("these import a test module; move what they share to a helper module named for what it "
                       f"holds, or its fixtures to conftest.py: {sorted(found)}")


@pytest.mark.parametrize("folder", ["bench", "lab"])
def test_the_benchmark_and_its_lab_import_nothing_from_the_tests(folder: str) -> None:
    files = python_files(folder)
    assert files, folder  # the positive control: there is code to read
    found = sorted({(str(p.relative_to(REPO)), line) for p in files
                    for line, module in imported(p.read_text(), module_of(p).rsplit(".", 1)[0])
                    if module == "tests" or module.startswith("tests.")})
    assert not found, f"the benchmark runs without the tests: move what these need out of tests/: {found}"
