"""The package as others depend on it: `pip install` into a venv that already has the newest pulumi 3.x SDK.

A user's project pins its own SDK; installing this package must not move it
(pyproject.toml gives ranges, the lab's exact pins live in constraints.txt).
Then the public API is imported from the installed package, from a directory
outside the repository so the source tree cannot stand in for it.

Needs the package index, or a warm pip cache: ${LLMGW_CACHE:-/var/cache/llmgw-pulumi}/pip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.pip

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def run(*cmd: str | Path, cwd: Path | None = None) -> str:
    env = {**os.environ, "PIP_CACHE_DIR": str(CACHE / "pip"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def newest_pulumi_3(pip: Path) -> str:
    """The newest pulumi 3.x the index serves, as `pip index versions` lists it (newest first)."""
    out = run(pip, "index", "versions", "pulumi")
    listed = re.search(r"^Available versions: (.*)$", out, re.M)
    assert listed, f"unexpected `pip index versions` output:\n{out}"
    versions = [v for v in listed.group(1).split(", ") if re.fullmatch(r"3\.\d+\.\d+", v)]
    assert versions, f"no pulumi 3.x served: {listed.group(1)[:200]}"
    return versions[0]


def installed_version(python: Path, dist: str) -> str:
    return run(python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))").strip()


def test_install_keeps_the_users_newest_sdk_and_exposes_the_public_api(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python, pip = venv / "bin" / "python", venv / "bin" / "pip"

    sdk = newest_pulumi_3(pip)
    run(pip, "install", "-q", f"pulumi=={sdk}")
    assert installed_version(python, "pulumi") == sdk

    # A copy of what the package is built from, so the build leaves no build/ or
    # *.egg-info in the work tree; installed non-editable, like any dependency.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", PROJECT["readme"], *PROJECT["license-files"]):
        shutil.copy(REPO / name, src)
    shutil.copytree(REPO / "llmgw_pulumi", src / "llmgw_pulumi", ignore=shutil.ignore_patterns("__pycache__"))
    run(pip, "install", "-q", src)

    assert installed_version(python, "pulumi") == sdk, "installing llmgw-pulumi moved the user's pulumi SDK"

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    out = run(python, "-c", "\n".join([
        "import llmgw_pulumi, llmgw_pulumi.pki, llmgw_pulumi.transport",
        "from llmgw_pulumi import Node, NodeArgs, ConnectionArgs, ConfigError, __version__",
        "from pathlib import Path",
        "pkg = Path(llmgw_pulumi.__file__).parent",
        "print(__version__)",
        "print(pkg)",
        "print((pkg / 'py.typed').is_file())",
    ]), cwd=outside)
    version, location, typed = out.split()
    assert version == PROJECT["version"]
    assert Path(location).is_relative_to(venv), f"imported from {location}, not from the installed package"
    assert typed == "True", "py.typed is not shipped"
