"""The engine as the benchmark runs it: wrappers that count the CLI and its two plugins in cgroups of their own, and
the package frozen at the start of a run (docs/benchmark-method.md, "Why it is built this way")."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.config import ENGINE_CGROUP, IMPORT_RECORD_VAR, PROGRAM_CGROUP, PROVIDER_CGROUP, REPO


def write_wrappers(engine_bin: Path, d: Path) -> None:
    """`pulumi`, `pulumi-language-python` and `pulumi-resource-pulumi-python` that each count in a cgroup of their own.

    Each wrapper moves itself into its cgroup and execs the real program
    (same pid, so the CLI waits for and signals the real one; children such
    as the language host's and the provider's pythons stay in the cgroup).
    The engine looks a plugin up on PATH first and beside the running
    `pulumi` binary second, and warns when the two differ; the real binary
    is hard-linked here as `pulumi.real`, so both lookups find the wrappers.
    The language host finds its `pulumi-language-python-exec` beside the
    real binary it becomes.
    """
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    real = d / "pulumi.real"
    try:
        os.link(engine_bin / "pulumi", real)
    except OSError:  # another file system
        shutil.copy2(engine_bin / "pulumi", real)
    wrappers: dict[str, tuple[Path, Path, str | None]] = {
        "pulumi": (ENGINE_CGROUP, real, None),
        "pulumi-language-python": (PROGRAM_CGROUP, engine_bin / "pulumi-language-python", "program"),
        "pulumi-resource-pulumi-python": (PROVIDER_CGROUP, engine_bin / "pulumi-resource-pulumi-python",
                                          "provider"),
    }
    for name, (cgroup, target, kind) in wrappers.items():
        lines = ["#!/bin/sh", f"# bench/onboard.py: count {name} (and its children) in {cgroup.name}/.",
                 f"echo $$ > {cgroup}/cgroup.procs 2>/dev/null"]
        if kind is not None:  # check_imports: each kind of python records its imports apart
            lines.append(f'if [ -n "${{{IMPORT_RECORD_VAR}:-}}" ]; then unset PYTHONDONTWRITEBYTECODE; '
                         f'PYTHONPYCACHEPREFIX="${IMPORT_RECORD_VAR}/{kind}"; export PYTHONPYCACHEPREFIX; fi')
        lines.append(f'exec {target} "$@"')
        script = d / name
        script.write_text("\n".join(lines) + "\n")
        script.chmod(0o755)


def snapshot_package(snapshot: Path) -> None:
    """Freeze the package as it is now; the program's and the providers' pythons and this one import the copy."""
    shutil.rmtree(snapshot, ignore_errors=True)
    shutil.copytree(REPO / "llmgw_pulumi", snapshot / "llmgw_pulumi",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(snapshot))


def package_fingerprint(snapshot: Path) -> str:
    """git HEAD, whether the package differs from it, and a hash of the measured package files."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "llmgw_pulumi"],
                           capture_output=True, text=True).stdout.strip()
    digest = hashlib.sha256()
    for f in sorted((snapshot / "llmgw_pulumi").rglob("*.py")):
        digest.update(f.relative_to(snapshot).as_posix().encode() + b"\0" + f.read_bytes())
    return f"{head}{' + uncommitted changes' if dirty else ''} (package sha256 {digest.hexdigest()[:12]})"
