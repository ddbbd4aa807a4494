"""The pure core imports no I/O: each module that decides what a node should hold and what a change does loads
neither the Pulumi SDK, paramiko, subprocess, urllib nor ssl, directly or through another module.

The modules and the forbidden imports are declared once, in pyproject.toml (``[tool.llmgw-pulumi.layering]``).
Each pure module is imported in a fresh interpreter, which records who imported what, so a failure names the
module, the forbidden import and the chain of imports that reached it. A static pass covers the imports made
inside functions, which an import of the module does not run.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERING = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["llmgw-pulumi"]["layering"]
PURE: list[str] = LAYERING["pure"]
FORBIDDEN: list[str] = LAYERING["forbidden"]
ALLOWED: list[str] = LAYERING["allowed"]
PURE_FOLDERS: list[str] = LAYERING["pure-folders"]

PROBE = r"""
import importlib, json, sys

target, forbidden, allowed = sys.argv[1], sys.argv[2].split(","), set(sys.argv[3].split(","))
importer = {}


class Recorder:
    # Asked first for every module not loaded yet: records the module whose code asked for it.
    def find_spec(self, name, path=None, target=None):
        frame = sys._getframe(1)
        while frame is not None and (frame.f_code.co_filename.startswith("<frozen")
                                     or frame.f_globals.get("__name__", "").split(".")[0] == "importlib"):
            frame = frame.f_back
        importer.setdefault(name, frame.f_globals.get("__name__", "?") if frame is not None else "?")
        return None


def is_forbidden(name):
    return name not in allowed and any(name == f or name.startswith(f + ".") for f in forbidden)


def chain(name):
    # target -> ... -> name, by who imported whom (the target's packages are imported before it, and count as it);
    # [None, name] when the importer is not known.
    links = [name]
    while links[-1] != target and not target.startswith(links[-1] + "."):
        if links[-1] not in importer or len(links) > 100:
            return [None, name]
        links.append(importer[links[-1]])
    return links[::-1]


loaded_before = {name for name in sys.modules if is_forbidden(name)}
sys.meta_path.insert(0, Recorder())
importlib.import_module(target)
found = []
for name in sorted(n for n in sys.modules if is_forbidden(n)):
    links = ["(interpreter start)", name] if name in loaded_before else chain(name)
    # Only the first forbidden module on each chain: what the SDK imports in turn is not news.
    if not any(is_forbidden(link) for link in links[1:-1] if link):
        found.append(links)
print(json.dumps(found))
"""


def forbidden_imports(module: str, forbidden: list[str] = FORBIDDEN) -> list[list[str | None]]:
    """The chains (module -> ... -> forbidden module) that importing ``module`` in a fresh interpreter loads."""
    done = subprocess.run([sys.executable, "-c", PROBE, module, ",".join(forbidden), ",".join(ALLOWED)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"importing {module} failed:\n{done.stderr}"
    return json.loads(done.stdout)


def described(module: str, chains: list[list[str | None]]) -> str:
    return "\n".join(f"{module} loads {links[-1]}: " + " -> ".join(link or "(imported by an unknown module)"
                                                                     for link in links) for links in chains)


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_loads_no_sdk_ssh_process_or_network_module(module: str) -> None:
    chains = forbidden_imports(module)
    assert not chains, described(module, chains)


def test_the_probe_names_the_forbidden_import_and_its_chain() -> None:
    # Positive control: the transport reaches nodes with paramiko, and says so.
    chains = forbidden_imports("llmgw_pulumi.ssh.transport")
    assert ["llmgw_pulumi.ssh.transport", "paramiko"] in chains, chains
    assert "llmgw_pulumi.ssh.transport loads paramiko: llmgw_pulumi.ssh.transport -> paramiko" in described(
        "llmgw_pulumi.ssh.transport", chains)
    # ... and through another module: signing runs no process itself, the signer it imports does.
    signing = "llmgw_pulumi.certificates.signing"
    assert [signing, "llmgw_pulumi.certificates.signer", "subprocess"] in forbidden_imports(signing)
    # A submodule is forbidden with its package, but for those declared allowed.
    assert ["llmgw_pulumi.releases.approval", "urllib.request"] in forbidden_imports("llmgw_pulumi.releases.approval")
    loaded = forbidden_imports("llmgw_pulumi.releases.approval", ["urllib"])
    assert [links[-1] for links in loaded] == ["urllib.error", "urllib.request"], loaded  # not urllib.parse


def test_importing_the_package_loads_neither_the_sdk_nor_the_providers() -> None:
    chains = forbidden_imports("llmgw_pulumi")
    assert not chains, described("llmgw_pulumi", chains)
    assert forbidden_imports("llmgw_pulumi", ["llmgw_pulumi.providers", "llmgw_pulumi.stack.node"]) == []
    # The control: a name of the package loads what it names, and the SDK with it.
    assert forbidden_imports("llmgw_pulumi.providers.agent", ["pulumi"])


# --------------------------------------------------------------------------- imports inside functions


def is_module(name: str) -> bool:
    """Whether a dotted name of the package is a module (a file) rather than a name a module defines."""
    path = REPO / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_in(module: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``module``'s source, at any depth, relative ones made absolute; but for
    those of a module-level ``__getattr__``, which runs only for a name that moved out of the module (PEP 562)."""
    path = REPO / (module.replace(".", "/") + ".py")
    package = module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(), str(path))
    tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            # ``from . import x`` imports the module x; ``from .m import x`` the module m, or m.x when x is a module.
            found += [(node.lineno, f"{base}.{alias.name}" if not node.module or is_module(f"{base}.{alias.name}")
                       else base) for alias in node.names]
    return found


def impure_imports(module: str) -> list[str]:
    """Imports anywhere in ``module``'s source of a forbidden module, or of a module of the package outside the
    pure core."""
    bad = []
    for line, name in imports_in(module):
        forbidden = name not in ALLOWED and any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
        if forbidden or (name.startswith("llmgw_pulumi.") and name not in PURE):
            bad.append(f"{module}, line {line}: imports {name}")
    return bad


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_only_pure_modules_even_inside_functions(module: str) -> None:
    bad = impure_imports(module)
    assert not bad, "\n".join(bad)


def test_the_static_pass_sees_an_import_inside_a_function() -> None:
    # Positive control: the certificate provider imports pki (cryptography, files) only inside the functions that
    # issue a certificate, never at the top of the module.
    source = (REPO / "llmgw_pulumi" / "providers" / "certificate.py").read_text()
    on_top = {node.lineno for node in ast.parse(source).body if isinstance(node, (ast.Import, ast.ImportFrom))}
    pki = [bad for bad in impure_imports("llmgw_pulumi.providers.certificate") if bad.endswith("imports llmgw_pulumi.certificates.pki")]
    assert pki and not any(f"line {line}:" in bad for line in on_top for bad in pki), pki
    assert any(bad.endswith(": imports subprocess") for bad in impure_imports("llmgw_pulumi.stack.program"))


# --------------------------------------------------------------------------------------------- folders


def package_modules() -> list[str]:
    """Every module of the package but its ``__init__``s (a folder's holds its docstring; the package's, the public
    API, which imports its names from everywhere on first use)."""
    root = REPO / "llmgw_pulumi"
    return sorted(".".join(p.relative_to(REPO).with_suffix("").parts) for p in root.rglob("*.py")
                  if p.name != "__init__.py" and p.parent.name != "policy")


def unit(module: str) -> str:
    """The top-level piece of the package a module belongs to: its folder, or itself at the top."""
    return module.split(".")[1]


def test_every_module_of_a_pure_folder_is_in_the_pure_core() -> None:
    missing = [m for m in package_modules() if unit(m) in PURE_FOLDERS and m not in PURE]
    assert not missing, f"add to [tool.llmgw-pulumi.layering] pure in pyproject.toml: {missing}"


def folder_imports() -> dict[tuple[str, str], list[str]]:
    """(importing folder, imported folder) -> 'module, line: imports module', for imports between two top-level
    pieces of the package (its folders and its top-level modules), at any depth of the source."""
    found: dict[tuple[str, str], list[str]] = {}
    for module in package_modules():
        for line, name in imports_in(module):
            if name.startswith("llmgw_pulumi.") and unit(name) != unit(module) and is_module(name):
                found.setdefault((unit(module), unit(name)), []).append(f"{module}, line {line}: imports {name}")
    return found


def test_the_folders_import_one_way() -> None:
    # The arrows point down: when a folder imports another, that one imports nothing of it.
    edges = folder_imports()
    both = [f"{a} <-> {b}:\n  " + "\n  ".join(edges[a, b] + edges[b, a]) for a, b in edges if a < b and (b, a) in edges]
    assert not both, "\n".join(both)
    assert ("providers", "nodestate") in edges and ("nodestate", "config") in edges  # the control: it sees imports


def architecture_rows() -> list[set[str]]:
    """The top-level pieces of the package, row by row, as docs/architecture.md's table lists them from the bottom
    up: a folder (`llmgw_pulumi/config/`), or the top-level modules a row names (`errors.py`)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## The package, by folder", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = line.split(" | ")
        if not line.startswith("| ") or len(cells) < 3 or line.startswith("| folder"):
            continue
        folder = re.search(r"`llmgw_pulumi/(\w+)/`", cells[0])
        rows.append({folder.group(1)} if folder else set(re.findall(r"`(\w+)\.py`", cells[1])))
    return rows


def test_the_architecture_page_lists_the_folders_in_the_order_they_import() -> None:
    rows = architecture_rows()
    row_of = {name: i for i, names in enumerate(rows) for name in names}
    units = {unit(m) for m in package_modules()} - {"moved"}
    assert units - set(row_of) == set(), "docs/architecture.md's table does not name these"
    upward = [f"{a} (row {row_of[a] + 1}) imports {b} (row {row_of[b] + 1}): " + why[0]
              for (a, b), why in folder_imports().items() if a in row_of and b in row_of and row_of[b] > row_of[a]]
    assert not upward, "\n".join(upward)
    assert row_of["errors"] == 0 and row_of["stack"] > row_of["providers"] > row_of["nodestate"]
