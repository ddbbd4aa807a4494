"""What the install and the CI examples run is pinned by digest (issue 36, item 8; review N10).

Read from the files as pip, GitHub Actions, GitLab and the Go tool read them: the venv is installed with
hashes from a lock that holds exactly the versions constraints.txt pins, the build backend included; every
action is a commit, every image a digest, the Pulumi archive checked against a sha256; the Go builds keep
the checksum database on. Each check is also run on a copy with its breach written in, so none passes
vacuously.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "examples" / "ci"
WORKFLOWS = sorted((CI / ".github" / "workflows").glob("*.yml"))
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def lock_entries(text: str) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of a pip requirements file with hashes (its continued lines joined)."""
    entries = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0] if not line.lstrip().startswith("--") else line
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        spec = line.split(";", 1)[0].split()[0]
        name, _, version = spec.partition("==")
        entries[name.lower().replace("_", "-")] = (version, len(HASH.findall(line)))
    return entries


def lock_problems(lock: str, constraints: str, backend: list[str]) -> list[str]:
    problems = []
    pinned = {n.lower().replace("_", "-"): v for n, _, v in
              (line.partition("==") for line in constraints.splitlines() if line and not line.startswith("#"))}
    entries = lock_entries(lock)
    for name, (version, hashes) in entries.items():
        if not version:
            problems.append(f"{name} is not pinned to one version")
        if hashes == 0:
            problems.append(f"{name} has no hash")
        if name in pinned and pinned[name] != version:
            problems.append(f"{name} is {version} in the lock but {pinned[name]} in constraints.txt")
    for requirement in backend:
        name, _, version = requirement.partition("==")
        if not version:
            problems.append(f"the build backend {requirement} is not pinned")
        elif (entry := entries.get(name.lower())) is None or entry[0] != version or not entry[1]:
            problems.append(f"the build backend {requirement} is not in the lock with its hashes")
    return problems


def backend() -> list[str]:
    requires: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    return requires


def test_the_lock_pins_what_constraints_pin_with_hashes_and_the_build_backend() -> None:
    lock, constraints = (ROOT / "requirements.lock").read_text(), (ROOT / "constraints.txt").read_text()
    assert lock_problems(lock, constraints, backend()) == []
    assert {"pulumi", "paramiko", "cryptography", "setuptools"} <= set(lock_entries(lock))  # it has the lot
    # Each breach is caught.
    assert lock_problems(lock.replace("paramiko==5.1.0", "paramiko==5.0.9"), constraints, backend())
    no_hash = re.sub(r"(paramiko==5\.1\.0)(?: \\\n\s+--hash=sha256:[0-9a-f]{64})+", r"\1", lock)
    assert no_hash != lock and lock_problems(no_hash, constraints, backend()) == ["paramiko has no hash"]
    assert lock_problems(lock, constraints, ["setuptools>=65"]) == ["the build backend setuptools>=65 is not pinned"]
    assert lock_problems(lock, constraints, ["setuptools==1.0"])


def install_problems(script: str) -> list[str]:
    """How scripts/install.sh's pip commands could install something the lock does not name with its hash."""
    problems = []
    pips = [shlex.split(line.split(">&2")[0]) for line in script.splitlines() if "bin/pip install" in line]
    if not pips:
        return ["no pip install"]
    for argv in pips:
        args = argv[argv.index("install") + 1:]
        if "-r" in args and args[args.index("-r") + 1] == "requirements.lock":
            if "--require-hashes" not in args:
                problems.append("the lock is installed without --require-hashes")
        elif not {"--no-deps", "--no-build-isolation", "--no-index"} <= set(args):
            problems.append(f"{' '.join(args)} may fetch what the lock does not hold")
        if "-c" in args:
            problems.append("a constraints file gives versions without hashes")
    return problems


def test_install_sh_installs_the_lock_with_hashes_and_builds_the_package_offline() -> None:
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert install_problems(script) == []
    assert install_problems(script.replace("--require-hashes ", "")) == ["the lock is installed without --require-hashes"]
    assert install_problems(script.replace("--no-build-isolation ", "")) != []


def test_the_venv_alone_is_rebuilt_when_the_lock_changes() -> None:
    """An install change must not rebuild the engine: the lock keys the venv's stamp, and nothing else's."""
    script = (ROOT / "scripts" / "install.sh").read_text()
    (stamp,) = [line for line in script.splitlines() if line.startswith("want=")]
    assert "requirements.lock" in stamp
    for other in ("engine.sh", "language-hosts.sh", "actionlint.sh"):
        assert "requirements.lock" not in (ROOT / "scripts" / other).read_text(), other


# --------------------------------------------------------------------------- CI examples

def action_problems(workflow: dict[str, Any]) -> list[str]:
    problems = []
    for name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses and not re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", uses):
                problems.append(f"{name}: {uses} is not pinned to a commit")
            run = step.get("run", "")
            if "pip install" in run and "--require-hashes" not in run:
                problems.append(f"{name}: pip installs without --require-hashes")
    return problems


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_a_commit_and_pip_requires_hashes(path: Path) -> None:
    workflow = yaml.safe_load(path.read_text())
    assert action_problems(workflow) == []
    assert any(s.get("uses") for j in workflow["jobs"].values() for s in j["steps"])  # there is something to check
    text = path.read_text()
    # The tag each commit stands for is beside it, for a reader and for updates.
    assert all(re.search(r"@[0-9a-f]{40}  # v\d+\.\d+\.\d+$", line) for line in text.splitlines() if "uses:" in line)
    broken = yaml.safe_load(re.sub(r"@[0-9a-f]{40}", "@v6", text, count=1))
    assert action_problems(broken) and action_problems(broken)[0].endswith("is not pinned to a commit")


def gitlab_problems(ci: dict[str, Any]) -> list[str]:
    problems = []
    images = [job["image"] for job in ci.values() if isinstance(job, dict) and "image" in job]
    if not images:
        problems.append("no image")
    problems += [f"image {i} is not pinned by digest" for i in images if not re.search(r"@sha256:[0-9a-f]{64}$", str(i))]
    script = "\n".join(ci["default"]["before_script"])
    if re.search(r"curl[^\n]*\|\s*(sh|bash)", script):
        problems.append("curl | sh")
    fetched, checked, unpacked = (script.find(w) for w in ("curl -fsSLo pulumi.tgz", "sha256sum -c", "tar -xzf pulumi.tgz"))
    if not 0 <= fetched < checked < unpacked:
        problems.append("the Pulumi archive is unpacked before its sha256 is checked")
    if "pip install" in script and "--require-hashes" not in script:
        problems.append("pip installs without --require-hashes")
    return problems


def test_the_gitlab_image_is_a_digest_and_pulumi_is_checked_before_it_is_unpacked() -> None:
    text = (CI / ".gitlab-ci.yml").read_text()
    assert gitlab_problems(yaml.safe_load(text)) == []
    assert gitlab_problems(yaml.safe_load(re.sub(r"@sha256:[0-9a-f]{64}", "", text))) == [
        "image python:3.11-slim is not pinned by digest"]
    unchecked = yaml.safe_load(text)
    unchecked["default"]["before_script"] = [s for s in unchecked["default"]["before_script"] if "sha256sum" not in s]
    assert gitlab_problems(unchecked) == ["the Pulumi archive is unpacked before its sha256 is checked"]


# --------------------------------------------------------------------------- Go

def go_env_problems(script: str) -> list[str]:
    """A Go build's environment that could skip the checksum database, or leave that to the machine's."""
    problems = []
    for var, ok in (("GOSUMDB", "sum.golang.org"), ("GONOSUMDB", ""), ("GOPRIVATE", ""), ("GOINSECURE", "")):
        found = re.findall(rf"\b{var}=('[^']*'|\S*)", script)
        if not found:
            problems.append(f"{var} is left to the environment")
        elif any(v.strip("'") != ok for v in found):
            problems.append(f"{var} is set to {found}")
    if "-mod=mod" in script or "-insecure" in script:
        problems.append("a build may change go.sum")
    return problems


@pytest.mark.parametrize("script", ["engine.sh", "language-hosts.sh", "actionlint.sh", "bench-tools.sh"])
def test_go_builds_verify_module_sums_against_the_checksum_database(script: str) -> None:
    text = (ROOT / "scripts" / script).read_text()
    assert "go " in text and go_env_problems(text) == []
    assert go_env_problems(text.replace("GOSUMDB=sum.golang.org", "GOSUMDB=off")) == ["GOSUMDB is set to ['off']"]


def test_the_go_example_has_its_sums() -> None:
    go_mod = (ROOT / "examples" / "go-vm" / "go.mod").read_text()
    go_sum = (ROOT / "examples" / "go-vm" / "go.sum").read_text()
    for module, version in re.findall(r"^require (\S+) (\S+)$", go_mod, flags=re.M):
        assert f"{module} {version} h1:" in go_sum and f"{module} {version}/go.mod h1:" in go_sum, module
