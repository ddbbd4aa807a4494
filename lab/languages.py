"""The Node.js and Go language hosts, and a project set up as `pulumi package add <this repository>` leaves it
(README, "From TypeScript or Go"): how the end-to-end language tests and the benchmark's TypeScript program set
up their projects."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from lab.stack import REPO

VIRTUALENV = str(REPO / ".venv")
"""The one setting (README, "From TypeScript or Go"): the virtualenv the dynamic-provider plugin runs."""


def dependencies() -> tuple[Path, Path]:
    """(the engine's bin dir with the Node.js and Go language hosts, the TypeScript example's node_modules):
    built or installed once and cached (scripts/language-hosts.sh)."""
    out = subprocess.run([str(REPO / "scripts" / "language-hosts.sh")], check=True, capture_output=True, text=True)
    bin_dir, modules = out.stdout.strip().splitlines()[-2:]
    return Path(bin_dir), Path(modules)


def package_add(stack: Any, lang: str, package_adds: dict[str, Path]) -> None:
    """The project as `pulumi package add <this repository>` leaves it (the generated SDK, the manifests it
    edited, the dependencies it linked): a copy of what the command wrote, its inputs unchanged; the one
    path it records, this repository's (Pulumi.yaml's ``packages``), names this checkout."""
    copy_project(package_adds[lang], stack.work_dir)
    project = yaml.safe_load((stack.work_dir / "Pulumi.yaml").read_text())
    assert set(project["packages"]) == {"llmgw"}, project
    project["packages"]["llmgw"] = str(REPO)
    (stack.work_dir / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))


def copy_project(src: Path, dst: Path) -> None:
    """A project's files but its stacks and its link to the virtualenv; dependency trees hard-linked (seconds)."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name in ("stacks", ".venv", ".complete"):
            continue
        if item.is_dir():
            subprocess.run(["cp", "-a", "--link", str(item), str(dst)], check=True)
        else:
            shutil.copy2(item, dst / item.name)


def added_packages() -> dict[str, Path]:
    """Per language, what `pulumi package add <this repository>` left in the example's project
    (scripts/package-adds.sh: run once and cached, keyed by everything the command reads)."""
    out = subprocess.run([str(REPO / "scripts" / "package-adds.sh")], check=True, capture_output=True, text=True)
    root, *keys = out.stdout.strip().splitlines()
    return {lang: Path(root) / f"{lang}-{key}" for lang, key in (line.split() for line in keys)}
