"""The package as others depend on it: `pip install` into a venv that already has the newest pulumi 3.x SDK.

A user's project pins its own SDK; installing this package must not move it
(pyproject.toml gives ranges, the lab's exact pins live in constraints.txt).
Then the public API is imported from the installed package, from a directory
outside the repository so the source tree cannot stand in for it.

And the README's quick start as an operator runs it, without root: the built wheel and its dependencies'
wheels installed into a fresh venv by an unprivileged account in its own home directory, its metadata read
back, `pulumi login --local`, `pulumi stack init` and a preview of the README's example stack.

Needs the package index, or a warm pip cache: ${LLMGW_CACHE:-/var/cache/llmgw-pulumi}/pip.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

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
        "import llmgw_pulumi, llmgw_pulumi.certificates.pki, llmgw_pulumi.ssh.transport",
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


# --------------------------------------------------------------------------- the README's quick start, not as root

OPERATOR = "nobody"
"""The operator's account: no root, no sudo, its own home directory (made for the test)."""


def as_operator(home: Path, env: dict[str, str]) -> Callable[..., str]:
    """run(), but as OPERATOR (setpriv: its uid and gid, no supplementary groups) with HOME=home."""
    entry = pwd.getpwnam(OPERATOR)
    ident = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--"]

    def operator(*cmd: str | Path, cwd: Path | None = None) -> str:
        full = {k: v for k, v in env.items() if not k.startswith(("PULUMI_", "PIP_", "VIRTUAL_ENV"))}
        full.update(HOME=str(home), USER=OPERATOR, PULUMI_HOME=str(home / ".pulumi"), PULUMI_SKIP_UPDATE_CHECK="true",
                    PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true", PULUMI_CONFIG_PASSPHRASE="operator's passphrase")
        full.pop("PYTHONPATH", None)
        res = subprocess.run([*ident, *map(str, cmd)], cwd=cwd, env=full, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        return res.stdout

    return operator


def readme_example_config() -> dict[str, object]:
    fences = [t.content for t in MarkdownIt("commonmark").parse((REPO / "README.md").read_text())
              if t.type == "fence" and t.info.strip() == "yaml" and t.content.startswith("# stacks/Pulumi.prod.yaml")]
    assert len(fences) == 1
    config: dict[str, object] = yaml.safe_load(fences[0])["config"]
    return config


@pytest.mark.engine
def test_an_operator_installs_the_built_wheel_without_root_and_previews_a_stack(tmp_path: Path) -> None:
    # The maintainers' side: the wheel, and the wheels of its dependencies at the constraints' versions.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", PROJECT["readme"], *PROJECT["license-files"]):
        shutil.copy(REPO / name, src)
    shutil.copytree(REPO / "llmgw_pulumi", src / "llmgw_pulumi", ignore=shutil.ignore_patterns("__pycache__"))
    dist, wheels = tmp_path / "dist", tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, src)
    (wheel,) = dist.glob("llmgw_pulumi-*.whl")
    run(sys.executable, "-m", "pip", "download", "-q", "-d", wheels, "-c", REPO / "constraints.txt", wheel)
    shutil.copy(wheel, wheels)

    # The operator's machine: a home directory of their own, a clone of the project, and nothing of root's.
    entry = pwd.getpwnam(OPERATOR)
    base = Path(tempfile.mkdtemp(prefix="llmgw-operator-"))
    try:
        home, project = base / "home", base / "home" / "llmgw-pulumi"
        (project / "stacks").mkdir(parents=True)
        for name in ("Pulumi.yaml", "__main__.py", "constraints.txt"):
            shutil.copy(REPO / name, project)
        shutil.copytree(wheels, home / "wheels")
        for path in [base, *base.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
        os.chmod(base, 0o755)
        from lab.stack import engine_bin

        # An ordinary user's PATH (the system's python3), with the pulumi CLI in front.
        env = {**os.environ, "PATH": f"{engine_bin()}:/usr/local/bin:/usr/bin:/bin"}
        operator = as_operator(home, env)
        assert operator("id", "-u").strip() == str(entry.pw_uid) != "0"

        # The README's quick start, step by step.
        operator("python3", "-m", "venv", ".venv", cwd=project)
        operator(".venv/bin/pip", "install", "-q", "--no-index", "--find-links", home / "wheels",
                 "-c", "constraints.txt", f"llmgw-pulumi=={PROJECT['version']}", cwd=project)
        shown = operator(".venv/bin/pip", "show", "-v", "llmgw-pulumi", cwd=project)
        metadata = json.loads(operator(project / ".venv" / "bin" / "python", "-c", "\n".join([
            "import importlib.metadata as m, json, llmgw_pulumi",
            "meta = m.metadata('llmgw-pulumi')",
            "print(json.dumps({k: meta.get_all(k) for k in ('Summary', 'License-Expression', 'Requires-Python',",
            "                  'Classifier', 'Project-URL', 'Author-email')} | {'file': llmgw_pulumi.__file__}))",
        ]), cwd=home))
        assert f"Summary: {PROJECT['description']}" in shown, shown
        assert metadata["Summary"] == [PROJECT["description"]]
        assert metadata["License-Expression"] == [PROJECT["license"]]
        assert metadata["Requires-Python"] == [PROJECT["requires-python"]]
        assert metadata["Classifier"] == PROJECT["classifiers"]
        assert sorted(metadata["Project-URL"]) == sorted(f"{k}, {v}" for k, v in PROJECT["urls"].items())
        assert Path(metadata["file"]).is_relative_to(project / ".venv"), metadata["file"]

        # `pulumi login --local` for an account whose passwd entry has this home (the CLI reads the entry, and
        # nobody's is /nonexistent): the state in ~/.pulumi.
        operator("pulumi", "login", f"file://{home}/.pulumi", cwd=project)
        operator("pulumi", "stack", "init", "prod", "--secrets-provider", "passphrase", cwd=project)
        stack_file = project / "stacks" / "Pulumi.prod.yaml"
        written = yaml.safe_load(stack_file.read_text())
        assert "encryptionsalt" in written, "stack init wrote no salt"
        # The settings and nodes of the README's example, into the file stack init made (keeping its salt).
        stack_file.write_text(yaml.safe_dump({**written, "config": readme_example_config()}, sort_keys=False))
        preview = json.loads(operator("pulumi", "preview", "--stack", "prod", "--json", "--non-interactive",
                                      cwd=project))
        planned = {s["urn"].rsplit("::", 1)[1] for s in preview["steps"]
                   if s["op"] == "create" and s["urn"].split("::")[2] == "llmgw:index:Node"}
        nodes = readme_example_config()["llmgw:nodes"]
        assert isinstance(nodes, list)
        assert planned == {n["id"] for n in nodes}, preview["steps"]
        assert (home / ".pulumi").is_dir(), "pulumi login --local keeps the state in the operator's home"
        assert all(p.stat().st_uid == entry.pw_uid for p in (home / ".pulumi").rglob("*"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
