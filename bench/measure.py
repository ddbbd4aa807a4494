"""What one benchmark run measures: CPU counters per cgroup, the engine's steps from its event log, the state's
size, memory; and the Result a run is recorded as (docs/benchmark-method.md, "What is measured")."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.config import CLK_TCK, ENGINE_CGROUP, HOSTS_CGROUP, OWN_CGROUP, PEM_RE, PROGRAM_CGROUP, PROVIDER_CGROUP, REMOTE_TYPES
from lab import light

SCRIPT_TIME = re.compile(r": (?P<script>[\w.-]+\.sh) took (?P<seconds>[\d.]+)s on ")
"""A provider's debug line for each script it ran on a node (llmgw_pulumi/ssh/connection.py, ``run``)."""

T = TypeVar("T")


# --------------------------------------------------------------------------- counters


def machine_cpu() -> float:
    """CPU-seconds the whole machine has spent busy since boot (all CPUs, containers included)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / CLK_TCK


def cgroup_cpu(path: Path) -> float:
    """CPU-seconds a cgroup v2 subtree has used (0 while it does not exist)."""
    try:
        for line in (path / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "usage_usec":
                return int(value) / 1e6
    except OSError:
        pass
    return 0.0


@dataclass(frozen=True)
class Counters:
    """A snapshot of the clocks one measured run is the difference of."""

    wall: float
    machine: float
    operator: float
    """This process and all its children (includes `engine` and `provider`)."""
    hosts: float
    engine: float = 0.0
    """The `pulumi` CLI processes: the engine (`up`, `preview`, ...; also `stack select`, `stack export`)."""
    provider: float = 0.0
    """The dynamic-provider plugin processes (the project's providers run there)."""
    program: float = 0.0
    """The Python language host and the program's python it starts (`__main__.py`: the resource graph)."""
    ksmd: float = 0.0
    """The kernel's samepage-merging thread, which merges light hosts' pages (lab/light.py); in `machine`, not ours."""

    @classmethod
    def now(cls) -> Counters:
        return cls(time.monotonic(), machine_cpu(), cgroup_cpu(OWN_CGROUP), cgroup_cpu(HOSTS_CGROUP),
                   cgroup_cpu(ENGINE_CGROUP), cgroup_cpu(PROVIDER_CGROUP), cgroup_cpu(PROGRAM_CGROUP),
                   light.ksmd_cpu_seconds())

    def __sub__(self, other: Counters) -> Counters:
        return Counters(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))

    def __add__(self, other: Counters) -> Counters:
        return Counters(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))

    @property
    def bench_process(self) -> float:
        """This process (control plane, release server) and its children other than the CLI and its plugins."""
        return self.operator - self.engine - self.provider - self.program


@contextlib.contextmanager
def own_cgroup() -> Iterator[None]:
    """Run this process (and every child started from now on) in a cgroup of its own.

    Its CPU usage then separates our side (engine, program, provider, scripts, ssh,
    release server, control plane) from the lab hosts and from whatever else
    the machine runs. Not below lg<lab>: a lab sweep kills everything there.
    """
    original = Path("/proc/self/cgroup").read_text()
    root_rel = next((line[3:] for line in original.splitlines() if line.startswith("0::")), "/")
    home = Path("/sys/fs/cgroup/unified") / root_rel.lstrip("/")
    OWN_CGROUP.mkdir(exist_ok=True)
    (OWN_CGROUP / "cgroup.procs").write_text(str(os.getpid()))
    for sub in (ENGINE_CGROUP, PROGRAM_CGROUP, PROVIDER_CGROUP):
        sub.mkdir(exist_ok=True)
    try:
        yield
    finally:
        (home / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):  # busy if a child outlived us; harmless, reused next time
            for d in (ENGINE_CGROUP, PROGRAM_CGROUP, PROVIDER_CGROUP, OWN_CGROUP):
                d.rmdir()


# --------------------------------------------------------------------------- results


@dataclass
class StateSize:
    """Exported deployment JSON per node, and which resource types hold the bytes."""

    total: int
    total_no_pem: int
    per_node: float
    per_node_no_pem: float
    by_type_no_pem: dict[str, int]
    by_field_no_pem: dict[str, int]
    """Top-level fields of a resource in state: inputs, outputs, stackTrace, propertyDependencies, ..."""
    biggest_keys_no_pem: list[tuple[str, int]]
    secret_ciphertext: int
    """Bytes of encrypted secret values (the SSH key, the node key) in all."""
    by_owner_no_pem: dict[str, int] = dataclasses.field(default_factory=dict)
    """Who decides the bytes (``owner_of``): the engine, the SDK's dynamic providers, this package."""


@dataclass
class Result:
    """One measured run."""

    size: int
    scenario: str
    ok: bool
    wall: float
    ssh: int
    cpu: Counters
    idle_rate: float
    """Machine CPU-s per second just before the run, with the hosts quiet."""
    idle_own_rate: float
    """The same for this process's cgroup + the hosts' cgroups."""
    agents_up: float | None = None
    """Seconds from the start until every agent's stream was accepted (onboarding runs)."""
    remote_ops: int | None = None
    """Resource operations that reach a node (pulumi runs)."""
    state: StateSize | None = None
    note: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    delay_ms: int = 0
    """Round-trip delay added by the proxies (0: plain bridge, no proxy)."""
    shards: int | None = None
    """Provider processes forced for the run (None: the package's default)."""
    kind: str = ""
    """The scenario without its repeat number, provider count or delay ('pulumi up, no-op')."""
    reduced_ca: bool = False
    """The hosts trusted 3 system CAs (--reduced-ca, scale runs)."""
    backend_bytes: int | None = None
    """Bytes written to the state backend during the run (checkpoint traffic; bench/backend.py says how)."""
    state_bytes: int | None = None
    """The stack's state after the run, as `pulumi stack export` prints it (summed over the stacks run at once)."""
    stacks: int = 1
    """Stacks run at once against the one backend, the nodes split evenly between them."""
    backend: str = ""
    """The state backend of the run, as shown (no password), e.g. file:///var/cache/... or postgres://..."""

    @property
    def cpu_own(self) -> float:
        """CPU-s of this process with its children, and of the lab hosts."""
        return self.cpu.operator + self.cpu.hosts

    @property
    def cpu_own_net(self) -> float:
        """cpu_own minus what the same spends idle over the same time (agents, control plane)."""
        return self.cpu_own - self.idle_own_rate * self.cpu.wall


@dataclass
class Step:
    type: str
    op: str
    start: float
    end: float | None = None


class EngineSteps:
    """Start and end of every resource step of one engine run, as seen from this process.

    LabStack tails the event log the CLI writes (``--event-log``) and calls back
    within about 0.05 s of each event, a JSON object with one event field
    (camelCase): ``resourcePreEvent`` when a step starts (the provider call
    follows), ``resOutputsEvent`` or ``resOpFailedEvent`` when it ends,
    ``summaryEvent`` when the engine is done. A step's ``metadata`` carries its
    ``urn``, ``type`` and ``op`` ("create", "same", "update", "refresh", ...).
    """

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.steps: dict[str, list[Step]] = {}
        self.changes: dict[str, int] = {}
        self.prelude: float | None = None
        self.summary: float | None = None
        self.scripts: dict[str, list[float]] = {}
        """Script name -> the seconds each run of it took (SCRIPT_TIME lines, one per run)."""
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            if "preludeEvent" in event:
                self.prelude = now
            elif "resourcePreEvent" in event:
                m = event["resourcePreEvent"]["metadata"]
                self.steps.setdefault(m["urn"], []).append(Step(short_type(m["type"]), m["op"], now))
            elif "resOutputsEvent" in event or "resOpFailedEvent" in event:
                m = (event.get("resOutputsEvent") or event["resOpFailedEvent"])["metadata"]
                open_steps = [s for s in self.steps.get(m["urn"], []) if s.end is None]
                if open_steps:
                    open_steps[0].end = now
            elif "diagnosticEvent" in event:
                if took := SCRIPT_TIME.search(event["diagnosticEvent"].get("message", "")):
                    self.scripts.setdefault(took["script"], []).append(float(took["seconds"]))
            elif "summaryEvent" in event:
                self.summary = now
                self.changes = {op: int(n) for op, n in (event["summaryEvent"].get("resourceChanges") or {}).items()}

    def all_steps(self) -> list[Step]:
        return [s for steps in self.steps.values() for s in steps]

    def acting(self) -> list[Step]:
        """Steps that did something (not 'same'), with an end."""
        return [s for s in self.all_steps() if s.op != "same" and s.end is not None]

    def remote_ops(self) -> int:
        return sum(1 for s in self.all_steps() if s.op != "same" and s.type in REMOTE_TYPES)

    def by_type(self) -> dict[str, dict[str, float]]:
        """Per resource type and op: count, mean and max step duration, first start and last end (s from t0)."""
        groups: dict[str, list[Step]] = {}
        for s in self.all_steps():
            if s.end is not None:
                groups.setdefault(f"{s.type} {s.op}", []).append(s)
        out = {}
        for key, steps in sorted(groups.items(), key=lambda kv: min(s.start for s in kv[1])):
            durations = [s.end - s.start for s in steps if s.end is not None]
            out[key] = {
                "count": len(steps),
                "mean_s": statistics.fmean(durations),
                "max_s": max(durations),
                "first_start_s": min(s.start for s in steps) - self.t0,
                "last_end_s": max(s.end for s in steps if s.end is not None) - self.t0,
            }
        return out

    def max_in_flight(self, types: Sequence[str] = REMOTE_TYPES + ("ClientCertificate",)) -> int:
        """Most provider steps in flight at once (a step in flight may be queued inside the provider)."""
        edges = []
        for s in self.acting():
            if s.type in types and s.end is not None:
                edges += [(s.start, 1), (s.end, -1)]
        level = peak = 0
        for _, delta in sorted(edges):
            level += delta
            peak = max(peak, level)
        return peak

    def node_steps(self) -> dict[str, list[Step]]:
        """Node id -> its ClientCertificate, NodeIdentity, AgentInstall and EngineCheck steps that created or
        updated it and ended (``chains`` and ``critical_path`` read them)."""
        nodes: dict[str, list[Step]] = {}
        for urn, steps in self.steps.items():
            for s in steps:
                if s.op in ("create", "update") and s.end is not None and s.type in ("ClientCertificate",) + REMOTE_TYPES:
                    nodes.setdefault(urn.rsplit("::", 1)[-1], []).append(s)
        return nodes

    def chains(self, idle_seconds: float) -> dict[str, float]:
        """Per node, ClientCertificate -> NodeIdentity -> AgentInstall -> EngineCheck: how long, and the gaps.

        A node whose AgentInstall starts more than the transport's idle time
        after its NodeIdentity ended finds its pooled SSH connection closed and
        opens another one.
        """
        nodes = {node: {s.type: s for s in steps} for node, steps in self.node_steps().items()}
        spans, gaps = [], []
        for chain in nodes.values():
            if "ClientCertificate" in chain and "EngineCheck" in chain:
                spans.append(chain["EngineCheck"].end - chain["ClientCertificate"].start)  # type: ignore[operator]
            if "NodeIdentity" in chain and "AgentInstall" in chain:
                gaps.append(chain["AgentInstall"].start - chain["NodeIdentity"].end)  # type: ignore[operator]
        if not spans and not gaps:
            return {}
        return {"chain_mean_s": statistics.fmean(spans) if spans else 0.0, "chain_max_s": max(spans, default=0.0),
                "identity_to_agent_gap_max_s": max(gaps, default=0.0),
                "gaps_over_idle": float(sum(1 for g in gaps if g > idle_seconds)), "idle_seconds": idle_seconds}

    def critical_path(self) -> dict[str, float]:
        """The node whose last step ended last, from the run's start: each of its steps (create or update) and
        the waits before them, then the engine's end. A wait before the first step is the CLI's, the program's
        and the provider process's start; one between steps, the engine scheduling the next (a free --parallel
        slot, the program's registration of it). Empty when no node had four steps."""
        chains = [sorted(c, key=lambda s: s.start) for c in self.node_steps().values() if len(c) == 4]
        if not chains:
            return {}
        last = max(chains, key=lambda c: c[-1].end or 0.0)
        path: dict[str, float] = {}
        at = self.t0
        for s in last:
            path[f"wait before {s.type}"] = s.start - at
            path[s.type] = (s.end or s.start) - s.start
            at = s.end or s.start
        if self.summary is not None:
            path["last step's end to the summary"] = self.summary - at
        return path

    def script_seconds(self) -> dict[str, dict[str, float]]:
        """Per script run on the nodes: runs, mean and max seconds (a round trip and its time on the node)."""
        return {name: {"runs": len(t), "mean_s": statistics.fmean(t), "max_s": max(t)}
                for name, t in sorted(self.scripts.items())}

    def timeline(self) -> dict[str, float]:
        """Seconds from t0 to: the engine's prelude, the first step, the last step's end, the summary."""
        starts = [s.start for s in self.all_steps()]
        ends = [s.end for s in self.all_steps() if s.end is not None]
        rel = lambda t: None if t is None else t - self.t0  # noqa: E731
        return {k: v for k, v in {"prelude": rel(self.prelude), "first_step": rel(min(starts, default=None)),
                                  "last_step_end": rel(max(ends, default=None)),
                                  "summary": rel(self.summary)}.items() if v is not None}


def transport_idle_seconds() -> float:
    """How long the package keeps an idle pooled SSH connection (its transport's IDLE_SECONDS)."""
    try:
        from llmgw_pulumi.ssh import transport

        return float(getattr(transport, "IDLE_SECONDS", float("inf")))
    except ImportError:
        return float("inf")


def short_type(type_: str) -> str:
    """'pulumi-python:dynamic/llmgw:NodeIdentity' -> 'NodeIdentity'."""
    return str(type_).rsplit(":", 1)[-1]


def parallel(fns: Sequence[Callable[[], T]], workers: int | None = None) -> list[T]:
    """Run callables in threads, return their results in order, raise the first error."""
    if not fns:
        return []
    with ThreadPoolExecutor(max_workers=workers or len(fns)) as pool:
        return [f.result() for f in [pool.submit(fn) for fn in fns]]


SDK_KEYS = frozenset({"__provider"})
"""Inputs and outputs the Python SDK adds to every dynamic resource: its provider, pickled (both sections)."""


def owner_of(field: str, key: str | None = None) -> str:
    """Who decides a resource's ``field`` in state (``key``: the input or output, for those two): "package" for
    the inputs and outputs this package gives, "sdk" for what the Python SDK adds to them, "engine" for the rest
    (URN, type, parent, provider reference, dependencies, propertyDependencies, timestamps, call stack)."""
    if field not in ("inputs", "outputs"):
        return "engine"
    return "sdk" if key in SDK_KEYS else "package"


def state_size(deployment: dict[str, Any], nodes: int) -> StateSize:
    """Bytes of the exported deployment JSON per node, with and without PEM bodies, and where they are."""
    text = json.dumps(deployment)
    no_pem = PEM_RE.sub("", text)
    size = lambda value: len(PEM_RE.sub("", json.dumps(value)))  # noqa: E731
    by_type: dict[str, int] = {}
    by_field: dict[str, int] = {}
    keys: dict[str, int] = {}
    owners: dict[str, int] = {}
    entry = lambda name, value: len(json.dumps(name)) + 2 + size(value) + 2  # noqa: E731  # "name": value,
    secrets = 0
    for res in deployment.get("resources", []):
        t = short_type(res.get("type", "?"))
        by_type[t] = by_type.get(t, 0) + size(res)
        decided = {"engine": 0, "sdk": 0}
        for name, value in res.items():
            by_field[name] = by_field.get(name, 0) + size(value)
            if owner_of(name) == "engine":
                decided["engine"] += entry(name, value)
        for section in ("inputs", "outputs"):
            for k, v in (res.get(section) or {}).items():
                key = f"{t}.{section}.{k}"
                keys[key] = keys.get(key, 0) + size(v)
                if owner_of(section, k) == "sdk":
                    decided["sdk"] += entry(k, v)
        decided["package"] = size(res) - decided["engine"] - decided["sdk"]  # its inputs and outputs, braces too
        for who, b in decided.items():
            owners[who] = owners.get(who, 0) + b
        secrets += sum(len(m) for m in re.findall(r'"ciphertext": "[^"]*"', json.dumps(res)))
    biggest = sorted(keys.items(), key=lambda kv: -kv[1])[:10]
    return StateSize(len(text), len(no_pem), len(text) / nodes, len(no_pem) / nodes,
                     dict(sorted(by_type.items(), key=lambda kv: -kv[1])),
                     dict(sorted(by_field.items(), key=lambda kv: -kv[1])), biggest, secrets,
                     dict(sorted(owners.items(), key=lambda kv: -kv[1])))


def mem_available_mib() -> float:
    return next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemAvailable:")) / 1024


#: Kernel memory a lab host takes outside its processes' PSS (slab, page tables, kernel stacks): 50 hosts on this
#: machine gave back 8.9 MiB each when torn down, of which 7.4 MiB was their processes' PSS (docs/benchmark-method.md).
KERNEL_MIB_PER_HOST = 2.5
#: Memory per host assumed until one is measured in the run (a booted host took 10 MiB; the agent adds its own).
ASSUMED_HOST_MIB = 25.0
ASSUMED_LIGHT_HOST_MIB = 8.0
"""A light host's memory before one is weighed in the run: the most one took in the light runs measured so far
(7.9 MiB booted at 210 hosts, 7.0 onboarded at 30; docs/test-hosts.md, "Light hosts")."""


def host_memory(cgroup: Path) -> tuple[float, int]:
    """(MiB, tasks) of the processes in a host's cgroup subtree: their proportional set size (shared pages split
    between the processes sharing them, pages KSM merged too), with the kernel memory KSM spends tracking their
    pages (light hosts only; lab/light.py), and their threads."""
    pss_kib = tasks = ksm_bytes = 0
    dirs = [cgroup]
    for top, subdirs, _ in os.walk(cgroup):  # a unit's cgroup may go while it is walked: os.walk skips it
        dirs += [Path(top) / d for d in subdirs]
    for d in dirs:
        try:
            tasks += len((d / "cgroup.threads").read_text().split())
            pids = (d / "cgroup.procs").read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            pss_kib += next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
            ksm_bytes += light.ksm_metadata_bytes(light.ksm_stat(int(pid)))
    return pss_kib / 1024 + ksm_bytes / 2**20, tasks


def host_capacity(host_mib: float, running: int, tasks: int = 0) -> int:
    """How many lab hosts this machine holds: 85% of the available memory (with the `running` hosts' back) and pids.

    `host_mib` is the most a host took in this run (its processes' PSS and the kernel's part, booted and onboarded;
    ASSUMED_HOST_MIB before any was measured); `tasks` the most threads a host ran (pids: twice that, at least 20).
    """
    per_host = host_mib or ASSUMED_HOST_MIB
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return min(int((mem_available_mib() + running * per_host) * 0.85 / per_host), pid_max // max(2 * tasks, 20))


def machine_description() -> dict[str, str]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "?")
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    return {"nproc": str(os.cpu_count()), "memory": f"{mem_kb / 1024 / 1024:.1f} GiB", "kernel": platform.release(),
            "cpu": model, "openssh": ssh_v}
