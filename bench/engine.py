"""The engine as the benchmark runs it: wrappers that count the CLI and its two plugins in cgroups of their own, and
the package frozen at the start of a run (docs/benchmark-method.md, "Why it is built this way")."""

from __future__ import annotations

import compileall
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bench.config import ENGINE_CGROUP, IMPORT_RECORD_VAR, LAB_SUBNET, PROGRAM_CGROUP, PROVIDER_CGROUP, REPO, WORK
from bench.measure import Counters

if TYPE_CHECKING:
    from bench.harness import Harness


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
    """Freeze the package as it is now; the program's and the providers' pythons and this one import the copy.

    The copy is compiled to bytecode, as `pip install` leaves an operator's package: no python of a run writes
    any (the machine sets PYTHONDONTWRITEBYTECODE), so each program and provider process would otherwise compile
    every module it imports, CPU that no operator's run spends, counted as theirs.
    """
    shutil.rmtree(snapshot, ignore_errors=True)
    shutil.copytree(REPO / "llmgw_pulumi", snapshot / "llmgw_pulumi",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if not compileall.compile_dir(snapshot / "llmgw_pulumi", quiet=1):
        raise RuntimeError(f"could not compile the package's snapshot in {snapshot} to bytecode")
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


def check_imports(bench: Harness) -> str:
    """Prove, with an unmeasured `pulumi preview`, that the engine's pythons import the snapshot and the CPU split holds.

    The preview of one node (an unused address: a preview only checks the
    inputs, in the provider, and contacts no node) runs with
    PYTHONPYCACHEPREFIX set by the plugin wrappers to one directory per kind
    of process (and PYTHONDONTWRITEBYTECODE unset), where each python writes
    the bytecode of every module it imports under the source file's absolute
    path: a record of which copy of the package the program and the
    providers really imported. The preview's CPU must also show in each of
    the three cgroups.
    """
    record = WORK / "import-record"
    shutil.rmtree(record, ignore_errors=True)
    stack = bench.new_stack("import-check", extra_env={IMPORT_RECORD_VAR: str(record)})
    stack.set_config(bench.stack_config([("import-check", f"{LAB_SUBNET}.250")]))
    c0 = Counters.now()
    run = stack.preview()
    cpu = Counters.now() - c0
    (bench.log_dir / "import-check-preview.log").write_text(run.output)
    if not run.ok:
        raise RuntimeError(f"the import check's `pulumi preview` failed:\n{run.output[-2000:]}")
    problems = []
    found: dict[str, list[str]] = {}
    for kind, must in (("program", "llmgw_pulumi/stack/program"), ("provider", "llmgw_pulumi/providers/")):
        imported = [p.relative_to(record / kind) for p in (record / kind).rglob("*.pyc") if "llmgw_pulumi" in p.parts]
        snapshot = bench.snapshot.relative_to("/")
        elsewhere = ["/" + p.as_posix() for p in imported if not p.is_relative_to(snapshot)]
        found[kind] = sorted(p.relative_to(snapshot).as_posix() for p in imported if p.is_relative_to(snapshot))
        if elsewhere:
            problems.append(f"the {kind} imported another copy of the package: {elsewhere[:3]}")
        if not any(m.startswith(must) for m in found[kind]):
            problems.append(f"the {kind} did not import {must}* from {bench.snapshot}")
    for part in ("engine", "program", "provider"):
        if getattr(cpu, part) <= 0:
            problems.append(f"no CPU counted for the {part} (its wrapper did not take effect)")
    if problems:
        raise RuntimeError(f"import check (see {bench.log_dir / 'import-check-preview.log'}): {'; '.join(problems)}")
    return (f"the program imported {len(found['program'])} and the provider {len(found['provider'])} modules "
            f"of llmgw_pulumi, all from {bench.snapshot}; preview CPU-s: engine {cpu.engine:.2f}, "
            f"language host + program {cpu.program:.2f}, provider {cpu.provider:.2f}")
