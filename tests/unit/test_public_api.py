"""The package's public surface is exactly ``__all__``; every error is in it, and errors.py's tree is true."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import types
from pathlib import Path

import pytest

import llmgw_pulumi
from llmgw_pulumi import errors


def _package_errors() -> dict[str, type]:
    """Every subclass of LlmgwError defined anywhere in the package, by name."""
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(llmgw_pulumi.__path__, "llmgw_pulumi."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, errors.LlmgwError) and value.__module__ == info.name:
                found[name] = value
    return found


def test_the_public_surface_is_exactly_all() -> None:
    # dir(): the names imported on first use are listed before they are used (the package's __dir__).
    public = {name for name in dir(llmgw_pulumi)
              if not name.startswith("_") and not isinstance(getattr(llmgw_pulumi, name), types.ModuleType)}
    assert public == set(llmgw_pulumi.__all__) - {"__version__"}
    assert len(llmgw_pulumi.__all__) == len(set(llmgw_pulumi.__all__))


def test_each_name_imported_on_first_use_is_the_one_a_type_checker_sees() -> None:
    # The package imports its modules when a name is first used; under TYPE_CHECKING it imports them as usual.
    source = Path(llmgw_pulumi.__file__).read_text()
    block = next(node for node in ast.parse(source).body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "_TYPE_CHECKING")
    typed = {alias.name: "." * node.level + (node.module or "")
             for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert typed == llmgw_pulumi._PUBLIC
    for name, module in llmgw_pulumi._PUBLIC.items():
        assert getattr(llmgw_pulumi, name) is getattr(importlib.import_module(module, "llmgw_pulumi"), name)
    with pytest.raises(AttributeError, match="no attribute 'Nod'"):
        llmgw_pulumi.Nod  # noqa: B018


def test_every_error_is_defined_in_errors_and_exported() -> None:
    found = _package_errors()
    assert "StackConfigError" in found and "WaitExpired" in found  # the walk sees the moved ones
    assert {cls.__module__ for cls in found.values()} == {"llmgw_pulumi.errors"}
    assert set(found) == set(errors.__all__)
    assert set(errors.__all__) <= set(llmgw_pulumi.__all__)


def test_the_tree_in_errors_docstring_is_the_hierarchy() -> None:
    doc = errors.__doc__ or ""
    lines = [line for line in doc.splitlines() if re.search(r"(LlmgwError$|[├└]── )", line)]
    assert lines, "errors.py's docstring shows the hierarchy as a tree"
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        name = re.search(r"([A-Za-z]+)(\s|$)", line.replace("├── ", "").replace("└── ", "").replace("│", " ")
                         .strip() + " ").group(1)  # type: ignore[union-attr]
        depth = (len(line) - len(line.lstrip(" │├└─"))) // 4
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[name] = stack[-1][1]
        stack.append((depth, name))
    found = _package_errors()
    assert set(parents) | {"LlmgwError"} == set(found)
    for name, parent in parents.items():
        assert found[name].__mro__[1].__name__ == parent, name
