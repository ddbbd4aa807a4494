"""Running a Pulumi project with the `pulumi` CLI, exactly as an operator types it, from tests and the local lab.

A ``LabStack`` is one stack of one project directory (this repository, or one
of ``examples/``): it runs ``pulumi stack init``, ``pulumi config set``,
``pulumi preview``/``up``/``refresh``/``destroy``, ``pulumi stack output`` and
``pulumi stack export`` as subprocesses in that directory. The CLI starts the
Python language host, which runs the project's ``__main__.py`` in the venv
named by ``Pulumi.yaml``; the dynamic providers run in the real
``pulumi-resource-pulumi-python`` plugin. Nothing here imports the Pulumi SDK.

Everything is local: a file backend, passphrase secrets, no update checks,
no plugin downloads, no Pulumi Cloud.

Besides the CLI's own output (what the operator reads), every engine command
writes the engine's JSON event log (``--event-log``); a run's ``changes`` come
from its summary event, and ``on_event`` callers see each event as the engine
writes it (the benchmark times resource steps that way).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
PASSPHRASE = "llmgw-lab-passphrase"


def engine_bin() -> Path:
    """Build (once, cached) or find the engine and its plugins; returns their bin directory."""
    out = subprocess.run([str(REPO / "scripts" / "engine.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


COMMAND_PLUGIN_VERSION = "v1.2.1"
"""pulumi-command's provider, matching the pulumi-command Python package the constraints pin."""


def engine_env(bin_dir: Path, home: Path, backend: Path) -> dict[str, str]:
    """The environment of every CLI call: the engine first on PATH, a local file backend, passphrase secrets.

    The PULUMI_HOME's plugin cache holds pulumi-command's provider: a link to
    one installed once per engine and provider version (``shared_plugins``),
    so a new home costs no install; the engine only reads it.
    """
    home.mkdir(parents=True, exist_ok=True)
    backend.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    env.update({
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PULUMI_HOME": str(home),
        "PULUMI_BACKEND_URL": f"file://{backend}",
        "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        # Unhides --event-log (the Automation API sets it for the same reason); the output is unchanged.
        "PULUMI_DEBUG_COMMANDS": "true",
    })
    plugins = home / "plugins"
    if not plugins.exists():
        plugins.symlink_to(shared_plugins(bin_dir, env))
    return env


def shared_plugins(bin_dir: Path, env: dict[str, str]) -> Path:
    """A plugin cache holding pulumi-command's provider (the one scripts/engine.sh built), installed with
    `pulumi plugin install --file` once, beside the engine, under a lock: test processes may ask at once."""
    root = bin_dir.parent / f"plugin-home-command-{COMMAND_PLUGIN_VERSION}"
    plugins = root / "plugins"
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (plugins / f"resource-command-{COMMAND_PLUGIN_VERSION}").is_dir():
            built = bin_dir.parent / "plugins" / "pulumi-resource-command"
            subprocess.run([str(bin_dir / "pulumi"), "plugin", "install", "resource", "command", COMMAND_PLUGIN_VERSION,
                            "--file", str(built), "--non-interactive"], env={**env, "PULUMI_HOME": str(root)},
                           check=True, capture_output=True)
    return plugins


# The keyword options a test may pass, and the CLI flag each one becomes.
_FLAGS: dict[str, str] = {
    "clear_pending_creates": "--clear-pending-creates",
    "diff": "--diff",
    "expect_no_changes": "--expect-no-changes",
    "refresh": "--refresh",
    "show_secrets": "--show-secrets",
    "skip_preview": "--skip-preview",
}


@dataclass
class Run:
    """One CLI command: the operator's view (its whole output) and the engine's (its event log)."""

    command: list[str]
    output: str
    seconds: float
    returncode: int
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def changes(self) -> dict[str, int]:
        """Resource changes by operation ("create", "update", "same", ...) from the engine's summary event."""
        for event in reversed(self.events):
            summary = event.get("summaryEvent")
            if summary is not None:
                return {op: int(n) for op, n in (summary.get("resourceChanges") or {}).items()}
        return {}

    @property
    def result(self) -> SimpleNamespace:
        """The same counts under the names the Automation API gave them (``summary.resource_changes``, ``change_summary``)."""
        return SimpleNamespace(summary=SimpleNamespace(resource_changes=self.changes), change_summary=self.changes)

    def diagnostics(self, severity: str | None = None) -> list[dict[str, Any]]:
        """The engine's diagnostic events (``urn``, ``severity``, ``message``), optionally of one severity."""
        found = [e["diagnosticEvent"] for e in self.events if "diagnosticEvent" in e]
        return [d for d in found if severity is None or d.get("severity") == severity]


class _EventTail(threading.Thread):
    """Follows an event-log file while the CLI writes it, handing each event to a callback as it appears."""

    def __init__(self, path: Path, callback: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(daemon=True)
        self.path, self.callback = path, callback
        self.done = threading.Event()

    def run(self) -> None:
        while not self.path.exists():
            if self.done.wait(0.05):
                return
        with self.path.open() as f:
            pending = ""
            while True:
                chunk = f.readline()
                if chunk:
                    pending += chunk
                    if pending.endswith("\n"):
                        self.callback(json.loads(pending))
                        pending = ""
                elif self.done.wait(0.05):
                    for line in (pending + f.read()).splitlines():
                        if line.strip():
                            self.callback(json.loads(line))
                    return


@dataclass
class LabStack:
    """One stack of a Pulumi project, driven by the `pulumi` CLI in the project's work dir.

    ``work_dir`` is where the CLI runs. With ``project`` given (a directory
    holding ``Pulumi.yaml`` and ``__main__.py``), the files at the project's top
    level are copied there and ``.venv`` is linked to this repository's venv;
    without it, ``work_dir`` is the project itself (the repository, for the
    ``local`` stack).
    """

    work_dir: Path
    name: str
    env: dict[str, str]
    project: Path | None = None
    echo: bool = False
    """Also print each engine command and its output as it runs (the local main job does)."""
    runs: list[Run] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.project is not None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            for item in self.project.iterdir():  # Pulumi.yaml, __main__.py and whatever else the project keeps beside them
                if item.is_file():
                    shutil.copy2(item, self.work_dir / item.name)
            venv = self.work_dir / ".venv"
            if not venv.exists():
                venv.symlink_to(REPO / ".venv")
        (self.work_dir / "stacks").mkdir(exist_ok=True)
        # The engine's event logs go beside the state (in PULUMI_HOME for another backend), not into the project.
        backend = self.env.get("PULUMI_BACKEND_URL", "")
        beside = Path(backend.removeprefix("file://")) if backend.startswith("file://") else Path(self.env["PULUMI_HOME"])
        self.logs = beside / "events" / self.name
        self.logs.mkdir(parents=True, exist_ok=True)
        self.cli("stack", "select", "--create", self.name, "--secrets-provider", "passphrase")

    # ------------------------------------------------------------------ plain CLI calls

    def cli(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """``pulumi <args>`` in the work dir, non-interactive; raises with the CLI's output when ``check`` and it fails.
        (The reading commands below name their stack: several stacks may share a work dir.)"""
        done = subprocess.run(["pulumi", *args, "--non-interactive"], cwd=self.work_dir, env=self.env, input=input,
                              capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"pulumi {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    @property
    def config_path(self) -> Path:
        return self.work_dir / "stacks" / f"Pulumi.{self.name}.yaml"

    def set_config(self, config: dict[str, Any], namespace: str = "llmgw") -> None:
        """Write the stack's config file: keys without the namespace, values as YAML data (replaces all config)."""
        existing = yaml.safe_load(self.config_path.read_text()) if self.config_path.exists() else {}
        existing = existing or {}
        existing["config"] = {f"{namespace}:{k}": v for k, v in config.items()}
        self.config_path.write_text(yaml.safe_dump(existing, sort_keys=False))

    def config_set(self, key: str, value: str, *, secret: bool = False, path: bool = False) -> None:
        """``pulumi config set [--secret] [--path] KEY`` with the value on standard input, as an operator does."""
        flags = [*(["--secret"] if secret else []), *(["--path"] if path else [])]
        self.cli("config", "set", key, *flags, "--stack", self.name, input=value)

    # ------------------------------------------------------------------ engine commands

    def _engine(self, verb: list[str], on_event: Callable[[dict[str, Any]], None] | None, **kwargs: Any) -> Run:
        unknown = set(kwargs) - set(_FLAGS)
        if unknown:
            raise TypeError(f"LabStack.{verb[0]}: no CLI flag for {sorted(unknown)}; known: {sorted(_FLAGS)}")
        flags = [_FLAGS[k] for k, v in kwargs.items() if v]
        log = self.logs / f"events-{len(self.runs)}.jsonl"
        log.unlink(missing_ok=True)
        events: list[dict[str, Any]] = []

        def record(event: dict[str, Any]) -> None:
            events.append(event)
            if on_event is not None:
                on_event(event)

        tail = _EventTail(log, record)
        tail.start()
        command = ["pulumi", *verb, "--stack", self.name, "--color", "never", "--event-log", str(log), *flags]
        if self.echo:
            print(f"$ {' '.join(command[:command.index('--stack') + 2] + flags)}", flush=True)
        start = time.monotonic()
        lines: list[str] = []
        with subprocess.Popen([*command, "--non-interactive"], cwd=self.work_dir, env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if self.echo:
                    print(line, end="", flush=True)
        seconds = time.monotonic() - start
        tail.done.set()
        tail.join()
        run = Run(command, "".join(lines), seconds, proc.returncode, events)
        self.runs.append(run)
        return run

    def up(self, on_event: Callable[[dict[str, Any]], None] | None = None, **kw: Any) -> Run:
        return self._engine(["up", "--yes", "--skip-preview"], on_event, **kw)

    def preview(self, on_event: Callable[[dict[str, Any]], None] | None = None, **kw: Any) -> Run:
        return self._engine(["preview"], on_event, **kw)

    def refresh(self, on_event: Callable[[dict[str, Any]], None] | None = None, **kw: Any) -> Run:
        return self._engine(["refresh", "--yes", "--skip-preview"], on_event, **kw)

    def destroy(self, on_event: Callable[[dict[str, Any]], None] | None = None, **kw: Any) -> Run:
        return self._engine(["destroy", "--yes", "--skip-preview"], on_event, **kw)

    # ------------------------------------------------------------------ reading the stack

    def outputs(self) -> dict[str, Any]:
        """``pulumi stack output --json --show-secrets``, and each node's outputs under its node id (read from the
        ``nodes`` output, one line of JSON per node, as llmgw_pulumi.stack.fleet.read_nodes reads it)."""
        out: dict[str, Any] = json.loads(self.cli("stack", "output", "--json", "--show-secrets", "--stack", self.name).stdout or "{}")
        if isinstance(out.get("nodes"), str):
            from llmgw_pulumi.stack.fleet import read_nodes

            out = {**read_nodes(out["nodes"]), **out}
        return out

    def export(self) -> dict[str, Any]:
        """The deployment with secrets decrypted (``pulumi stack export --show-secrets``)."""
        deployment: dict[str, Any] = json.loads(self.cli("stack", "export", "--show-secrets", "--stack", self.name).stdout)["deployment"]
        return deployment

    def export_raw(self) -> str:
        """``pulumi stack export`` as an operator runs it: secrets stay ciphertext."""
        return self.cli("stack", "export", "--stack", self.name).stdout

    def state_files(self) -> list[Path]:
        """The file backend's state and history for this stack: what is at rest on disk."""
        root = Path(self.env["PULUMI_BACKEND_URL"].removeprefix("file://")) / ".pulumi"
        return [p for p in root.rglob("*") if p.is_file() and self.name in p.name]

    def cancel(self) -> None:
        """``pulumi cancel``: release the lock an interrupted update left."""
        self.cli("cancel", "--yes", "--stack", self.name)

    def remove(self) -> None:
        self.cli("stack", "rm", self.name, "--yes", "--force")

    def all_output(self) -> str:
        return "\n".join(r.output for r in self.runs)
