"""What the install and the CI examples run is pinned by digest (issue 36, item 8; review N10).

Read from the files as pip, GitHub Actions, GitLab and the Go tool read them: the venv is installed with
hashes from a lock that holds exactly the versions constraints.txt pins, the build backend included; every
action is a commit, every image a digest, the Pulumi archive checked against a sha256; the Go builds keep
the checksum database on. Each check is also run on a copy with its breach written in, so none passes
vacuously.
"""

from __future__ import annotations

import hashlib
import io
import re
import shlex
import subprocess
import tarfile
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
    if "pip install" in script and "--require-hashes" not in script:
        problems.append("pip installs without --require-hashes")
    return problems


def test_the_gitlab_image_is_a_digest_and_nothing_is_piped_to_a_shell() -> None:
    text = (CI / ".gitlab-ci.yml").read_text()
    assert gitlab_problems(yaml.safe_load(text)) == []
    assert gitlab_problems(yaml.safe_load(re.sub(r"@sha256:[0-9a-f]{64}", "", text))) == [
        "image python:3.11-slim is not pinned by digest"]
    piped = yaml.safe_load(text)
    piped["default"]["before_script"].insert(1, "curl -fsSL https://get.pulumi.com | sh")
    assert gitlab_problems(piped) == ["curl | sh"]


# --------------------------------------------------------------------------- the Pulumi CLI in CI

INSTALL_PULUMI = CI / "install-pulumi.sh"
CI_FILES = [CI / ".gitlab-ci.yml", *WORKFLOWS]
UNCHECKED_PULUMI = re.compile(
    r"get\.pulumi\.com|github\.com/pulumi/pulumi/releases|pulumi/(?:actions|setup-pulumi|action-install-pulumi-cli)@")
"""Ways to get the Pulumi CLI that check no pinned sha256: its release URLs, its installer, actions that fetch it."""
RUNS_PULUMI = re.compile(r"\b(?:preview|up|refresh)\.sh\b|\bpulumi\s+(?:preview|up|refresh|stack|login)\b")


def ci_jobs(ci: dict[str, Any], gitlab: bool) -> dict[str, list[str]]:
    """What each job of a CI file runs, in order: GitLab's before_script (its own or the default) then its
    script; a GitHub job's steps, each its `uses:` or its `run:`."""
    if gitlab:
        default = (ci.get("default") or {}).get("before_script", [])
        return {name: [*job.get("before_script", default), *job["script"]]
                for name, job in ci.items() if isinstance(job, dict) and "script" in job}
    return {name: [str(step.get("uses") or step.get("run", "")) for step in job.get("steps", [])]
            for name, job in ci["jobs"].items()}


def pulumi_install_problems(jobs: dict[str, list[str]]) -> list[str]:
    """A job that gets the Pulumi CLI any way but install-pulumi.sh, or runs pulumi without installing it so
    and putting what it installed first on PATH."""
    problems = []
    for name, commands in jobs.items():
        problems += [f"{name}: gets Pulumi unchecked: {c.strip()}" for c in commands if UNCHECKED_PULUMI.search(c)]
        runs = [i for i, c in enumerate(commands) if RUNS_PULUMI.search(c)]
        installs = [i for i, c in enumerate(commands) if "install-pulumi.sh" in c]
        if runs and not (installs and installs[0] < runs[0]):
            problems.append(f"{name}: runs pulumi without installing it with install-pulumi.sh first")
            continue
        for i in installs:
            command = commands[i]
            assigned = re.fullmatch(r"\s*(\w+)=\$\([^)]*install-pulumi\.sh\)\s*", command)
            on_path = re.search(r'install-pulumi\.sh\s*>>\s*"\$GITHUB_PATH"', command) or (
                assigned and any(f'PATH="${assigned.group(1)}:$PATH"' in later for later in commands[i + 1:]))
            if not on_path:
                problems.append(f"{name}: what install-pulumi.sh installs is not put on PATH: {command.strip()}")
    return problems


def load_ci(path: Path) -> dict[str, list[str]]:
    return ci_jobs(yaml.safe_load(path.read_text()), gitlab=path.name == ".gitlab-ci.yml")


@pytest.mark.parametrize("path", CI_FILES, ids=lambda p: p.name)
def test_every_ci_job_gets_pulumi_only_from_the_checked_install(path: Path) -> None:
    assert pulumi_install_problems(load_ci(path)) == []


def test_the_pulumi_check_sees_each_way_around_it() -> None:
    gitlab, fleet = load_ci(CI / ".gitlab-ci.yml"), load_ci(CI / ".github" / "workflows" / "fleet.yml")
    # Positive controls: the jobs that run pulumi are seen running it, and installing it.
    assert {n for n, c in gitlab.items() if any(RUNS_PULUMI.search(x) for x in c)} == {"preview", "up", "refresh"}
    assert {n for n, c in fleet.items() if any(RUNS_PULUMI.search(x) for x in c)} == {"preview", "up", "refresh"}
    action = "pulumi/actions@8e5e406f4007fca908480587cb9893c07090f58d"
    for jobs, breach, expected in [
        (fleet, lambda c: [action if "install-pulumi.sh" in x else x for x in c],
         "up: runs pulumi without installing it with install-pulumi.sh first"),
        (fleet, lambda c: [*c[:1], action, *c[1:]], f"up: gets Pulumi unchecked: {action}"),
        (fleet, lambda c: [x.replace(' >> "$GITHUB_PATH"', "") for x in c], "up: what install-pulumi.sh installs is not"),
        (gitlab, lambda c: [x for x in c if not x.startswith("export PATH=\"$pulumi_bin")],
         "up: what install-pulumi.sh installs is not put on PATH"),
        (gitlab, lambda c: ["curl -fsSL https://get.pulumi.com | sh" if "install-pulumi.sh" in x else x for x in c],
         "up: gets Pulumi unchecked: curl -fsSL https://get.pulumi.com | sh"),
        (gitlab, lambda c: [*c[2:], *c[:2]], "up: runs pulumi without installing it with install-pulumi.sh first"),
    ]:
        broken = dict(jobs, up=breach(jobs["up"]))
        assert broken["up"] != jobs["up"]
        assert any(p.startswith(expected) for p in pulumi_install_problems(broken)), (expected, broken["up"])


def install_script_problems(script: str) -> list[str]:
    """install-pulumi.sh must pin a version and a real sha256, and check the archive before unpacking it."""
    problems = []
    version = re.search(r"^PULUMI_VERSION=(\S*)$", script, flags=re.M)
    digest = re.search(r"^PULUMI_SHA256=(\S*)$", script, flags=re.M)
    if not version or not re.fullmatch(r"\d+\.\d+\.\d+", version.group(1)):
        problems.append("no pinned PULUMI_VERSION")
    if not digest or not re.fullmatch(r"[0-9a-f]{64}", digest.group(1)):
        problems.append(f"PULUMI_SHA256 is not a sha256: {digest.group(1) if digest else None!r}")
    lines = script.splitlines()
    where = {what: next((i for i, line in enumerate(lines) if re.search(pattern, line) and not line.startswith("#")), -1)
             for what, pattern in [("fetch", r"^curl .*-o "), ("check", r'"\$PULUMI_SHA256".*sha256sum -c --strict'),
                                   ("unpack", r"^tar -x")]}
    if not 0 <= where["fetch"] < where["check"] < where["unpack"]:
        problems.append(f"the archive is not checked with sha256sum -c --strict between its download and its unpacking: {where}")
    return problems


def test_install_pulumi_sh_pins_a_sha256_and_checks_it_before_unpacking() -> None:
    script = INSTALL_PULUMI.read_text()
    assert install_script_problems(script) == []
    digest = re.search(r"^PULUMI_SHA256=(\S*)$", script, flags=re.M)
    assert digest is not None
    assert install_script_problems(script.replace(digest.group(0), "PULUMI_SHA256=")) == ["PULUMI_SHA256 is not a sha256: ''"]
    assert install_script_problems(script.replace(digest.group(0), 'PULUMI_SHA256=""')) != []
    assert install_script_problems(script.replace(" --strict", "")) != []
    check = next(line for line in script.splitlines() if "sha256sum -c" in line)
    assert install_script_problems(script.replace(check, "true \\")) != []


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    """A Pulumi-shaped archive, and a PATH whose curl hands it out as any download (so the test sends nothing
    anywhere): returns the archive, its sha256 and the environment to run install-pulumi.sh in."""
    archive = tmp_path / "release.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        body = b"#!/bin/sh\necho v0.0.0-test\n"
        info = tarfile.TarInfo("pulumi/pulumi")
        info.size, info.mode = len(body), 0o755
        tar.addfile(info, io.BytesIO(body))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    curl = bin_dir / "curl"
    curl.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
                    f'cp {shlex.quote(str(archive))} "$out"\necho "$out" >> {shlex.quote(str(tmp_path / "fetched"))}\n')
    curl.chmod(0o755)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TMPDIR": str(scratch), "HOME": str(tmp_path)}
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest(), env


def run_install(script: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    copy = tmp_path / "install-pulumi.sh"
    copy.write_text(script)
    copy.chmod(0o755)
    return subprocess.run([str(copy)], env=env, capture_output=True, text=True, timeout=60)


def unpacked(env: dict[str, str]) -> list[Path]:
    return [p for p in Path(env["TMPDIR"]).rglob("*") if p.name == "pulumi"]


def with_digest(script: str, digest: str) -> str:
    pinned = re.search(r"^PULUMI_SHA256=\S*$", script, flags=re.M)
    assert pinned is not None
    return script.replace(pinned.group(0), f"PULUMI_SHA256={digest}")


def test_install_pulumi_sh_unpacks_the_archive_whose_sha256_it_pins(release, tmp_path: Path) -> None:
    _, digest, env = release
    done = run_install(with_digest(INSTALL_PULUMI.read_text(), digest), tmp_path, env)
    assert done.returncode == 0, done.stderr
    (bin_dir,) = done.stdout.splitlines()  # one line: the directory to put on PATH
    assert (Path(bin_dir) / "pulumi").read_bytes().startswith(b"#!/bin/sh")
    assert not list(Path(bin_dir).parent.glob("*.tar.gz"))  # the archive is not left behind


@pytest.mark.parametrize("digest", ["pinned", "", "0" * 64], ids=["shipped", "empty", "another"])
def test_install_pulumi_sh_unpacks_nothing_whose_sha256_differs(release, tmp_path: Path, digest: str) -> None:
    _, _, env = release
    script = INSTALL_PULUMI.read_text()
    done = run_install(script if digest == "pinned" else with_digest(script, digest), tmp_path, env)
    assert done.returncode != 0
    assert done.stdout == ""  # nothing for a job to put on PATH
    assert unpacked(env) == []
    assert "PULUMI_SHA256" in done.stderr  # the error names what to fix
    # A pin that is no sha256 at all is refused before anything is downloaded; a wrong one after.
    assert (tmp_path / "fetched").exists() == (digest != "")


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
