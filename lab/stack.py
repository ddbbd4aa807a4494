"""Running the project's Pulumi program under the real engine, from tests and the local lab.

The engine is the `pulumi` CLI built by scripts/engine.sh. The program runs as
an Automation API program: the SDK's own language server hands the CLI the
program over `--client`, so no separate `pulumi-language-python` plugin is
needed (its Go module is not served by the module proxy these machines reach;
see README). Dynamic providers run in the real `pulumi-resource-pulumi-python`
plugin process with the project's virtualenv.

Everything is local: a file backend, passphrase secrets, no update checks,
no plugin downloads, no Pulumi Cloud.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from pulumi import automation as auto

REPO = Path(__file__).resolve().parent.parent
PASSPHRASE = "llmgw-lab-passphrase"


def engine_bin() -> Path:
    """Build (once, cached) or find the engine; returns its bin directory."""
    out = subprocess.run([str(REPO / "scripts" / "engine.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def engine_env(bin_dir: Path, home: Path, backend: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    backend.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PULUMI_HOME": str(home),
        "PULUMI_BACKEND_URL": f"file://{backend}",
        "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK": "true",
        # The dynamic-provider plugin runs `<venv>/bin/python -m pulumi.dynamic`.
        "PULUMI_RUNTIME_VIRTUALENV": str(Path(sys.prefix)),
        # Lab resources (lab.vm) are dynamic providers too: their module must import there.
        "PYTHONPATH": str(REPO),
        "PULUMI_DEBUG_PROMISE_LEAKS": "false",
    }


@dataclass
class Run:
    """One CLI run: its full output (stdout + stderr as the operator sees it) and wall time."""

    command: str
    output: str
    seconds: float
    result: Any = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class LabStack:
    """A stack of this project in its own work dir, with its config written as YAML."""

    work_dir: Path
    name: str
    env: dict[str, str]
    program: Callable[[], Any] | None = None
    runs: list[Run] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "stacks").mkdir(exist_ok=True)
        if not (self.work_dir / "Pulumi.yaml").exists():  # a scratch project; the repo's own is used as it is
            (self.work_dir / "Pulumi.yaml").write_text(yaml.safe_dump({
                "name": "llmgw",
                "runtime": {"name": "python", "options": {"virtualenv": str(Path(sys.prefix))}},
                "stackConfigDir": "stacks",
            }))
        if self.program is None:
            from llmgw_pulumi.program import main

            self.program = main
        os.environ.update(self.env)  # the Automation API reads some of these from the process
        bin_dir = Path(self.env["PATH"].split(":")[0])
        cmd = auto.PulumiCommand(root=str(bin_dir.parent), skip_version_check=True)
        opts = auto.LocalWorkspaceOptions(work_dir=str(self.work_dir), env_vars=self.env, pulumi_command=cmd,
                                          secrets_provider="passphrase")
        self.stack = auto.create_or_select_stack(self.name, project_name="llmgw", program=self.program, opts=opts)

    @property
    def config_path(self) -> Path:
        return self.work_dir / "stacks" / f"Pulumi.{self.name}.yaml"

    def set_config(self, config: dict[str, Any]) -> None:
        """Write the stack's config file: keys without the llmgw: namespace, values as YAML data."""
        existing = yaml.safe_load(self.config_path.read_text()) if self.config_path.exists() else {}
        existing = existing or {}
        existing["config"] = {f"llmgw:{k}": v for k, v in config.items()}
        self.config_path.write_text(yaml.safe_dump(existing, sort_keys=False))

    def _run(self, command: str, fn: Callable[..., Any], **kwargs: Any) -> Run:
        lines: list[str] = []
        start = time.monotonic()
        result, error = None, None
        try:
            result = fn(on_output=lines.append, color="never", **kwargs)
        except auto.errors.CommandError as exc:
            error = exc
            lines.append(str(exc))
        run = Run(command, "\n".join(lines), time.monotonic() - start, result, error)
        self.runs.append(run)
        return run

    def up(self, **kw: Any) -> Run:
        return self._run("up", self.stack.up, **kw)

    def preview(self, **kw: Any) -> Run:
        return self._run("preview", self.stack.preview, **kw)

    def refresh(self, **kw: Any) -> Run:
        return self._run("refresh", self.stack.refresh, **kw)

    def destroy(self, **kw: Any) -> Run:
        return self._run("destroy", self.stack.destroy, **kw)

    def export(self) -> dict[str, Any]:
        """The deployment with secrets decrypted (the Automation API exports with --show-secrets)."""
        return self.stack.export_stack().deployment

    def export_raw(self) -> str:
        """`pulumi stack export` as an operator runs it: secrets stay ciphertext."""
        bin_dir = self.env["PATH"].split(":")[0]
        out = subprocess.run([f"{bin_dir}/pulumi", "stack", "export", "--stack", self.name, "--cwd", str(self.work_dir)],
                             env={**os.environ, **self.env}, capture_output=True, text=True, check=True)
        return out.stdout

    def state_files(self) -> list[Path]:
        """The file backend's state and history for this stack: what is at rest on disk."""
        root = Path(self.env["PULUMI_BACKEND_URL"].removeprefix("file://")) / ".pulumi"
        return [p for p in root.rglob("*") if p.is_file() and self.name in p.name]

    def outputs(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.stack.outputs().items()}

    def remove(self) -> None:
        self.stack.workspace.remove_stack(self.name, force=True)

    def all_output(self) -> str:
        return "\n".join(r.output for r in self.runs)
