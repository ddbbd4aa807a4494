"""Issues 6 and 12's benchmark: onboarding N real-systemd lab hosts with the original script and with `pulumi up`.

    sudo .venv/bin/python -m bench.onboard            # the full run (see --help for the sizes; ~40 min)
    sudo .venv/bin/python -m bench.onboard --quick    # a smoke run, about 3 min

Options: [--sizes 1,10,30] [--latency-sizes 1,10,30] [--scale-sizes 100,200]
[--shards 4,8,16] [--shard-sizes 30,100] [--signer-sizes 30] [--language-sizes 30] [--reduced-ca]
[--repeats R] [--wait-quiet S] [--out FILE]; an empty list ("--scale-sizes ''")
skips that part. LLMGW_BENCH_LAB=name:subnet picks another lab than b:10.254.0
(its work dir is then /var/cache/llmgw-pulumi/bench-<name>).
It runs scripts/bench-tools.sh first (toxiproxy-server and matplotlib, built or
installed once and cached).

Measurement only, never part of the pass/fail tests. For every size N it boots
N lab hosts (lab "b" on 10.254.0.0/24, workdir /var/cache/llmgw-pulumi/lab-b)
and measures, in one run on the same hosts, each scenario on freshly booted
hosts (stop, wipe the host's overlay upper dir, start), so every onboarding
starts from a clean node:

1. the baseline, /work/shared/seed/onboard-node.sh run from its path (never
   modified) with the llmgw test double as --binary (release v1.4.2, the venv
   python as shebang so `ctl cert issue-client` works; the nodes download the
   release from the lab release server), one node after another ("sequential")
   and all N at once ("parallel");
2. the `pulumi` CLI in a project directory, as an operator types it (lab.stack.LabStack):
   `pulumi up` of this repository's project (its Pulumi.yaml and __main__.py)
   onboarding the N nodes from an empty state, then on the onboarded fleet a
   no-op `pulumi up`, `pulumi preview` and `pulumi refresh`, and `pulumi up` of
   an empty project (a Pulumi.yaml like the repository's and a __main__.py that
   registers nothing) as the engine's own floor;
3. the floor: what the hosts must spend anyway, measured on fresh hosts with
   every file staged from outside: one SSH connection per host running `true`,
   then `update-ca-certificates` (the CA is new to the host), then
   `systemctl enable --now llmgw-agent` until every agent's stream is accepted.

Per run it prints wall time, SSH connections the hosts accepted (TcpPassiveOpens
deltas of their network namespaces; sshd is the only listener on a lab host),
CPU-seconds of the whole machine (/proc/stat user+nice+system+irq+softirq over
all CPUs / CLK_TCK, containers included), the part of it that was ours, by
cgroup: this process with its children (scripts, ssh, release server, control
plane), the `pulumi` CLI (the engine), the Python language host with the
program's python, and the dynamic-provider plugin (wrappers move each of the
last three into a cgroup of its own), and the lab hosts; and for `pulumi up`
the state bytes per node (exported deployment JSON / N, with and without PEM
bodies). Then the ratios issue 6 sets targets for, and where the time went
(per-resource step durations from the engine's event log, the script's phases).
The results table, with the machine it ran on, is written to docs/benchmark.md
(--quick: only printed, and written under the bench work dir); every figure of
every run, as JSON, and the logs of each command go to
/var/cache/llmgw-pulumi/bench-b/logs/<time>/.

Why it is built this way:
- Machine CPU is what the issue asks for, but other labs (other developers'
  tests) may run on the same machine at the same time; the own-cgroup split
  shows how much of the machine total was ours.
- Before every measured run the lab hosts must be idle (a freshly booted host
  keeps systemd busy for several seconds), else boot work is billed to the run.
- The CPU window of an onboarding run lasts until the last agent's stream is
  accepted by the control plane: the agent starts after `systemctl restart`
  returns, and its start is part of onboarding for both contenders.
- The baseline's `ssh`/`scp` read ~/.ssh of the passwd home (root's); wrapper
  scripts first on PATH add `-F <generated ssh_config>` naming only the lab key
  and a throwaway known_hosts file, and then include /etc/ssh/ssh_config, so
  nothing else about OpenSSH's behaviour changes and /root/.ssh stays untouched.
- The package is copied once at start and put first on PYTHONPATH, so an edit
  of the working tree during the run cannot mix two versions in one table.
  The CLI passes its environment on to the language host, which runs the
  program's python, and to the provider plugin, so both import the copy; setup
  checks that with an unmeasured `pulumi preview` whose two pythons record the
  files they import (PYTHONPYCACHEPREFIX, one directory per process kind).
- CPU is split the way the processes are: the engine (`pulumi`), the language
  host `pulumi-language-python` with the pythons it starts (the program, which
  builds the resource graph, and its own queries of the venv: `pip list`,
  `pip --version`, ...), and `pulumi-resource-pulumi-python` (the providers:
  SSH, the nodes' work). The engine finds a plugin on PATH first, then beside the
  running `pulumi`; the bench's engine directory holds a `pulumi` wrapper, the
  real binary hard-linked beside it as `pulumi.real`, and a wrapper for each of
  the two plugins that moves itself into its cgroup and execs the real plugin.
  As the plugins are beside the binary that runs, the CLI sees a regular
  install (no "using ... from $PATH" warning for them) and every child of a wrapper
  (the language host's python, the provider's python) is counted with it.
- Every engine run is one CLI call: its wall time is the `pulumi up` (preview,
  refresh) an operator waits for, from start to the last line of output.
- State is measured as `pulumi stack export` prints it, secrets encrypted, as
  stored.
- Other developers' labs may share the machine: the table shows their CPU
  rate during each run; --wait-quiet waits for it to stop before each run.

Issue 12's parts (bench/toxiproxy.py, bench/growth.py, bench/summary.py):

- Latency without netem (this kernel has no netem qdisc): toxiproxy-server on
  loopback with one proxy per host (127.0.0.1:<port> -> host:22) and a 25 ms
  latency toxic on each direction (+50 ms round trip). The seed script's
  ssh/scp (ssh_config Host blocks: HostName 127.0.0.1, Port, HostKeyAlias) and
  the stack (each node's address 127.0.0.1 and its proxy's port; the node id
  and hostname stay the node's own) both go through the same proxies. Only
  operator -> sshd traffic is delayed: the release download and the agent's
  stream to the control plane go from the host over the bridge, unproxied.
  The 0 ms figures are the plain-bridge runs (no proxy).
- Scale (--scale-sizes): `pulumi up` from scratch, no-op up, preview and
  refresh at 100 and 200 nodes; no baseline there (the parallel script at 200
  nodes alone would take ~5 min of host CPU, the sequential one ~10 min).
  With --reduced-ca the scale hosts' /etc/ca-certificates.conf lists 3 of the
  system CAs before each run (so update-ca-certificates rebuilds a 4-CA
  bundle); the report says so; default off.
- Provider processes (--shards 4,8,16 at --shard-sizes): `pulumi up` from
  scratch with LLMGW_PROVIDER_SHARDS set (llmgw_pulumi/shards.py).
- Signers (--signer-sizes, the CA-custody issue): at each size, `pulumi up`
  from scratch with the pkiDir default, then on freshly booted hosts with
  the CA key in a SoftHSM2 token (lab.hsm) signing through
  examples/signers/openssl-pkcs11.sh (maxParallel 1); both with
  `agent.fetch: operator` (the HSM's nodes trust its CA only, not the lab CA of
  the release server), and a control plane whose certificate the token signed
  for the HSM's agents. Then bench/signer.py's signing step alone, per
  certificate, for both. Wall time and CPU of the two ups side by side, with
  the ratio and seconds per certificate.
- Languages (--language-sizes, the languages issue; default none): at each
  size, `pulumi up` from scratch of the Python program, then on freshly booted
  hosts of bench/typescript-fleet (one Node component per node from
  TypeScript, set up as the README says); wall time, agents up and CPU side by
  side, with the ratio.
- Plots: wall time, engine / provider / program CPU and state bytes against N
  (log-log, docs/benchmark-*.png) with growth exponents fitted from 30 nodes on
  and over all sizes; a one-screen summary of issue 12's targets at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bench import growth
from bench.summary import Target, fmt, ratio, summary
from bench.toxiproxy import LOOPBACK
from lab import seed

if TYPE_CHECKING:
    from lab.stack import LabStack

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))
#: The lab's name and subnet: LLMGW_BENCH_LAB=name:subnet (default b:10.254.0), so the bench can share a machine.
LAB_NAME, _, LAB_SUBNET = os.environ.get("LLMGW_BENCH_LAB", "b:10.254.0").partition(":")
WORK = CACHE / f"bench-{LAB_NAME}"
SEED_SCRIPT = seed.SEED_SCRIPT
RELEASE = "v1.4.2"
RELEASE_PORT = 8443
SSH_USER = "deploy"
SSH_WAIT = 60
DELAY_MS = 25  # per direction: +50 ms round trip
TARGET_N = 30  # issue 12's targets are set at 30 nodes ...
SCALE_N = 100  # ... and at 100
STATE_LIMIT = 8192  # bytes of state per node without PEM bodies
OWN_CGROUP = Path(f"/sys/fs/cgroup/unified/llmgw-bench-{LAB_NAME}")
ENGINE_CGROUP = OWN_CGROUP / "engine"  # the wrapper `pulumi` moves itself here
PROGRAM_CGROUP = OWN_CGROUP / "program"  # the wrapper language host moves itself here; the program's python follows
PROVIDER_CGROUP = OWN_CGROUP / "provider"  # the wrapper dynamic-provider plugin moves itself here
#: Set for check_imports' preview only: the plugin wrappers then point PYTHONPYCACHEPREFIX at <it>/<kind>.
IMPORT_RECORD_VAR = "LLMGW_BENCH_IMPORT_RECORD"
HOSTS_CGROUP = Path(f"/sys/fs/cgroup/unified/lg{LAB_NAME}")
BOOT_TIMEOUT = 180.0
AGENT_TIMEOUT = 60.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
DOC = REPO / "docs" / "benchmark.md"

#: Resource types whose operations reach a node over SSH (ClientCertificate is local).
REMOTE_TYPES = ("NodeIdentity", "AgentInstall", "EngineCheck")
#: PEM blocks inside the exported state's JSON text (newlines there are the two characters "\n").
PEM_RE = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?-----END [A-Z0-9 ]+-----")
#: The seed script's progress lines, in order, and the phase each one starts.
SCRIPT_PHASES = (
    ("onboarding ", "reach ssh"),
    ("  issuing a certificate", "issue certificate (local)"),
    ("  installing the certificate", "copy identity, update-ca-certificates"),
    ("  installing llmgw", "download + verify + install binary"),
    ("  writing the configuration", "hostname, copy config and unit"),
    ("  starting the agent", "install unit, daemon-reload, enable, restart"),
)

FLOOR = "floor: update-ca-certificates + start agent, 1 SSH connection per node"
"""What the hosts must spend anyway: issue 12's floor, all nodes in parallel."""
SIGNED_UP = "pulumi up, from scratch, fetch: operator, signer"
"""The signer runs (--signer-sizes): this, then the signer's name (SIGNERS)."""
SIGNERS = ("pkiDir", "HSM")
LANGUAGE_UP = "pulumi up, from scratch, program in"
"""The language runs (--language-sizes): this, then the program's language (LANGUAGES)."""
LANGUAGES = ("Python", "TypeScript")
PLOTTED = ("pulumi preview", "pulumi up, no-op", "pulumi up, from scratch", "pulumi refresh")
"""The runs whose figures are plotted against N (plain bridge, the package's default provider count)."""

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

    @classmethod
    def now(cls) -> Counters:
        return cls(time.monotonic(), machine_cpu(), cgroup_cpu(OWN_CGROUP), cgroup_cpu(HOSTS_CGROUP),
                   cgroup_cpu(ENGINE_CGROUP), cgroup_cpu(PROVIDER_CGROUP), cgroup_cpu(PROGRAM_CGROUP))

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

    def chains(self, idle_seconds: float) -> dict[str, float]:
        """Per node, ClientCertificate -> NodeIdentity -> AgentInstall -> EngineCheck: how long, and the gaps.

        A node whose AgentInstall starts more than the transport's idle time
        after its NodeIdentity ended finds its pooled SSH connection closed and
        opens another one.
        """
        nodes: dict[str, dict[str, Step]] = {}
        for urn, steps in self.steps.items():
            for s in steps:
                if s.op in ("create", "update") and s.end is not None and s.type in ("ClientCertificate",) + REMOTE_TYPES:
                    nodes.setdefault(urn.rsplit("::", 1)[-1], {})[s.type] = s
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
        from llmgw_pulumi import transport

        return float(getattr(transport, "IDLE_SECONDS", float("inf")))
    except ImportError:
        return float("inf")


def short_type(type_: str) -> str:
    """'pulumi-python:dynamic/llmgw:NodeIdentity' -> 'NodeIdentity'."""
    return str(type_).rsplit(":", 1)[-1]


# --------------------------------------------------------------------------- the bench


def parallel(fns: Sequence[Callable[[], T]], workers: int | None = None) -> list[T]:
    """Run callables in threads, return their results in order, raise the first error."""
    if not fns:
        return []
    with ThreadPoolExecutor(max_workers=workers or len(fns)) as pool:
        return [f.result() for f in [pool.submit(fn) for fn in fns]]


@dataclass
class Bench:
    """The lab, the cluster around it (CA, control plane, release server) and the measured runs."""

    sizes: list[int]
    repeats: int
    log_dir: Path
    lab: Any = None
    control_plane: Any = None
    engine_bin: Path | None = None
    results: list[Result] = field(default_factory=list)
    latency_sizes: list[int] = field(default_factory=list)
    scale_sizes: list[int] = field(default_factory=list)
    shard_counts: list[int] = field(default_factory=list)
    shard_sizes: list[int] = field(default_factory=list)
    signer_sizes: list[int] = field(default_factory=list)
    language_sizes: list[int] = field(default_factory=list)
    """Sizes at which `pulumi up` of the Python program and of bench/typescript-fleet are compared (run_languages)."""
    """Sizes at which `pulumi up` with the pkiDir default and with the HSM signer are compared (run_signers)."""
    reduced_ca: bool = False
    """Scale runs: hosts trust 3 system CAs (update-ca-certificates then has less to do)."""
    delay_ms: int = 0
    """Round-trip delay of the runs now measured; set with route_through_proxies."""
    shards: int | None = None
    """Provider processes the runs now measured force (LLMGW_PROVIDER_SHARDS); None: the package's default."""
    toxiproxy: Any = None
    tools_dir: Path = Path()
    """Where scripts/bench-tools.sh put toxiproxy-server."""
    engine_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every engine run (--engine-env), e.g. to try an engine setting."""
    host_mib: float = 0.0
    """Memory one booted lab host took, as seen from MemAvailable (0 until 10 or more were booted at once)."""
    routes: dict[str, int] = field(default_factory=dict)
    """Host address -> loopback port of its proxy, while the runs go through the proxies."""
    wait_quiet: float = 0.0
    """Seconds to wait at most, before each run, for other work on the machine to stop."""
    imports: str = ""
    """What check_imports found: which copy of the package the engine's pythons import, and the CPU split."""
    started: float = field(default_factory=time.monotonic)

    # ----------------------------------------------------------------- paths

    @property
    def pki_dir(self) -> Path:
        return WORK / "pki"

    @property
    def operator_binary(self) -> Path:
        """The llmgw double the baseline gets as --binary: release v1.4.2, run by the venv python."""
        return WORK / "bin" / "llmgw"

    @property
    def release_url(self) -> str:
        return f"https://{LAB_SUBNET}.2:{RELEASE_PORT}"

    @property
    def snapshot(self) -> Path:
        return WORK / "snapshot"

    # ----------------------------------------------------------------- setup

    def setup(self) -> None:
        """Lab bridge and key, CA, binaries, release server, control plane, engine; a fresh state backend."""
        from lab import pki as labpki
        from lab.control_plane import ControlPlane
        from lab.doubles.llmgw import build_llmgw
        from lab.hosts import Lab
        from lab.release_server import publish_release
        from lab.stack import engine_bin

        WORK.mkdir(parents=True, exist_ok=True)
        for d in ("state", "projects"):
            shutil.rmtree(WORK / d, ignore_errors=True)
        if not (self.pki_dir / "ca.pem").exists():
            labpki.init_ca(self.pki_dir)
        seed.operator_binary(self.operator_binary, RELEASE)
        releases = WORK / "releases"
        shutil.rmtree(releases, ignore_errors=True)
        publish_release(releases, RELEASE, {"amd64": build_llmgw(RELEASE)})

        self.lab = Lab(name=LAB_NAME, subnet=LAB_SUBNET, workdir=CACHE / f"lab-{LAB_NAME}")
        shutil.rmtree(self.lab.workdir / "hosts", ignore_errors=True)
        self.lab.setup()

        rel_host = f"{LAB_SUBNET}.2"
        cert, key = labpki.issue_server_cert(self.pki_dir, WORK / "release-tls", "releases", ips=[rel_host], dns=[])
        rel_log = open(self.log_dir / "release-server.log", "ab")  # noqa: SIM115 - lives as long as the server
        proc = self.lab.run_in_netns(
            [sys.executable, "-m", "lab.release_server", "--root", str(releases), "--bind", rel_host,
             "--port", str(RELEASE_PORT), "--cert", str(cert), "--key", str(key)],
            netns_suffix="repo", addr_index=2, cwd=str(REPO), stdout=subprocess.PIPE, stderr=rel_log,
        )
        assert proc.stdout is not None
        if b"listening" not in proc.stdout.readline():
            raise RuntimeError(f"the release server did not start; see {self.log_dir / 'release-server.log'}")
        self.control_plane = ControlPlane(self.pki_dir, self.lab.gateway).start()
        self.engine_bin = engine_bin()
        self._engine_wrappers()
        self._snapshot_package()
        self.imports = self.check_imports()

    @property
    def engine_dir(self) -> Path:
        """The engine as the bench runs it: the real `pulumi` binary and wrappers of it and two plugins, side by side."""
        return WORK / "engine-wrap" / "bin"

    def _engine_wrappers(self) -> None:
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
        assert self.engine_bin is not None
        d = self.engine_dir
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        real = d / "pulumi.real"
        try:
            os.link(self.engine_bin / "pulumi", real)
        except OSError:  # another file system
            shutil.copy2(self.engine_bin / "pulumi", real)
        wrappers: dict[str, tuple[Path, Path, str | None]] = {
            "pulumi": (ENGINE_CGROUP, real, None),
            "pulumi-language-python": (PROGRAM_CGROUP, self.engine_bin / "pulumi-language-python", "program"),
            "pulumi-resource-pulumi-python": (PROVIDER_CGROUP, self.engine_bin / "pulumi-resource-pulumi-python",
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

    def _snapshot_package(self) -> None:
        """Freeze the package as it is now; the program's and the providers' pythons and this one import the copy."""
        shutil.rmtree(self.snapshot, ignore_errors=True)
        shutil.copytree(REPO / "llmgw_pulumi", self.snapshot / "llmgw_pulumi",
                        ignore=shutil.ignore_patterns("__pycache__"))
        sys.path.insert(0, str(self.snapshot))

    def check_imports(self) -> str:
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
        stack = self.new_stack("import-check", extra_env={IMPORT_RECORD_VAR: str(record)})
        stack.set_config(self.stack_config([("import-check", f"{LAB_SUBNET}.250")]))
        c0 = Counters.now()
        run = stack.preview()
        cpu = Counters.now() - c0
        (self.log_dir / "import-check-preview.log").write_text(run.output)
        if not run.ok:
            raise RuntimeError(f"the import check's `pulumi preview` failed:\n{run.output[-2000:]}")
        problems = []
        found: dict[str, list[str]] = {}
        for kind, must in (("program", "llmgw_pulumi/program"), ("provider", "llmgw_pulumi/providers/")):
            imported = [p.relative_to(record / kind) for p in (record / kind).rglob("*.pyc") if "llmgw_pulumi" in p.parts]
            snapshot = self.snapshot.relative_to("/")
            elsewhere = ["/" + p.as_posix() for p in imported if not p.is_relative_to(snapshot)]
            found[kind] = sorted(p.relative_to(snapshot).as_posix() for p in imported if p.is_relative_to(snapshot))
            if elsewhere:
                problems.append(f"the {kind} imported another copy of the package: {elsewhere[:3]}")
            if not any(m.startswith(must) for m in found[kind]):
                problems.append(f"the {kind} did not import {must}* from {self.snapshot}")
        for part in ("engine", "program", "provider"):
            if getattr(cpu, part) <= 0:
                problems.append(f"no CPU counted for the {part} (its wrapper did not take effect)")
        if problems:
            raise RuntimeError(f"import check (see {self.log_dir / 'import-check-preview.log'}): {'; '.join(problems)}")
        return (f"the program imported {len(found['program'])} and the provider {len(found['provider'])} modules "
                f"of llmgw_pulumi, all from {self.snapshot}; preview CPU-s: engine {cpu.engine:.2f}, "
                f"language host + program {cpu.program:.2f}, provider {cpu.provider:.2f}")

    def package_fingerprint(self) -> str:
        """git HEAD, whether the package differs from it, and a hash of the measured package files."""
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip() or "?"
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "llmgw_pulumi"],
                               capture_output=True, text=True).stdout.strip()
        digest = hashlib.sha256()
        for f in sorted((self.snapshot / "llmgw_pulumi").rglob("*.py")):
            digest.update(f.relative_to(self.snapshot).as_posix().encode() + b"\0" + f.read_bytes())
        return f"{head}{' + uncommitted changes' if dirty else ''} (package sha256 {digest.hexdigest()[:12]})"

    def teardown(self) -> None:
        if self.control_plane is not None:
            self.control_plane.stop()
        if self.lab is not None:
            self.lab.teardown()

    # ----------------------------------------------------------------- hosts

    def fresh_hosts(self, n: int, reduced_ca: bool = False) -> list[Any]:
        """Hosts 1..n booted from a clean upper dir; every other host of the lab stopped."""
        hosts = [self.lab.prepare(i, hostname=f"node{i}") for i in range(1, n + 1)]
        parallel([h.stop for h in self.lab.hosts.values()], workers=16)

        def wipe_and_start(h: Any) -> None:
            shutil.rmtree(h.upper, ignore_errors=True)
            shutil.rmtree(h.work, ignore_errors=True)
            h.start(timeout=BOOT_TIMEOUT)

        t = time.monotonic()
        before = mem_available_mib()
        parallel([lambda h=h: wipe_and_start(h) for h in hosts], workers=10)
        if n >= 10:  # what a booted host takes, for host_capacity (settles as systemd finishes booting)
            self.host_mib = max(self.host_mib, (before - mem_available_mib()) / n)
            self.say(f"memory: {self.host_mib:.0f} MiB per booted host at most so far, "
                     f"{mem_available_mib() / 1024:.1f} GiB available")
        if reduced_ca:
            for h in hosts:
                reduce_ca_bundle(h.root)
        self.say(f"booted {n} fresh host(s) in {time.monotonic() - t:.1f}s"
                 + (", each trusting 3 system CAs" if reduced_ca else ""))
        return hosts

    @staticmethod
    def ssh_opens(hosts: Sequence[Any]) -> int:
        return sum(parallel([h.passive_tcp_opens for h in hosts], workers=16))

    def quiesce(self, max_wait: float = 45.0, window: float = 1.0, threshold: float = 0.05) -> tuple[float, float]:
        """Wait until the lab hosts use under `threshold` of a CPU; return (machine, ours + hosts) CPU-s/s then.

        A freshly booted host keeps its systemd busy for several seconds. With
        --wait-quiet, also wait (that long at most) until the rest of the machine
        uses under a quarter of a CPU: other labs' work slows every wall time.
        """
        start = time.monotonic()
        hosts_quiet = False
        while True:
            c0 = Counters.now()
            time.sleep(window)
            d = Counters.now() - c0
            waited = time.monotonic() - start
            hosts_quiet = hosts_quiet or d.hosts / d.wall < threshold or waited > max_wait
            other = (d.machine - d.operator - d.hosts) / d.wall
            if hosts_quiet and (self.wait_quiet <= 0 or other < 0.25 or waited > max_wait + self.wait_quiet):
                return d.machine / d.wall, (d.operator + d.hosts) / d.wall

    def wait_agents(self, node_ids: Sequence[str], since: float, timeout: float = AGENT_TIMEOUT) -> float | None:
        """Wall-clock time when the last of `node_ids` had a stream accepted after `since`; None on timeout."""
        deadline = time.monotonic() + timeout
        last = since
        for node in node_ids:
            ev = self.control_plane.wait_for_event(
                lambda e, node=node: e.node_id == node and e.outcome == "accepted" and e.time >= since,
                max(0.0, deadline - time.monotonic()))
            if ev is None:
                return None
            last = max(last, ev.time)
        return last

    # ----------------------------------------------------------------- one measured run

    def measure(self, size: int, scenario: str, hosts: Sequence[Any], action: Callable[[], tuple[bool, dict[str, Any]]],
                agents: bool = False, quiet_first: bool = True) -> Result:
        """Run `action` between two counter snapshots; onboarding runs last until every agent is connected."""
        idle, idle_own = self.quiesce() if quiet_first else (0.0, 0.0)
        opens0 = self.ssh_opens(hosts)
        since = time.time()
        c0 = Counters.now()
        ok, detail = action()
        wall = time.monotonic() - c0.wall
        agents_up = None
        if agents and ok:
            at = self.wait_agents([h.hostname for h in hosts], since)
            agents_up = None if at is None else at - since
            if at is None:
                detail["note"] = (detail.get("note", "") + " agents not all connected").strip()
        cpu = Counters.now() - c0
        ssh = self.ssh_opens(hosts) - opens0
        label = scenario + (f", {self.shards} providers" if self.shards else "")
        label += f" (+{self.delay_ms} ms RTT)" if self.delay_ms else ""
        result = Result(size, label, ok, wall, ssh, cpu, idle, idle_own, agents_up=agents_up,
                        remote_ops=detail.pop("remote_ops", None), note=detail.pop("note", ""), detail=detail,
                        delay_ms=self.delay_ms, shards=self.shards, kind=scenario.rsplit(" #", 1)[0])
        self.results.append(result)
        self.say(one_line(result))
        return result

    def say(self, text: str) -> None:
        """Progress, stamped with the minutes since the start (the whole run takes a while)."""
        print(f"  [{(time.monotonic() - self.started) / 60:5.1f} min] {text}", flush=True)

    # ----------------------------------------------------------------- the baseline

    def openssh_env(self) -> contextlib.AbstractContextManager[dict[str, str]]:
        """`ssh`/`scp` with the lab key, a throwaway known_hosts and the routes through the proxies (lab.seed)."""
        return seed.openssh_env(self.lab.ssh_key_path, proxy_host_blocks(self.routes))

    def run_script(self, host: Any, env: dict[str, str], log: Path) -> dict[str, Any]:
        """One onboard-node.sh invocation; every stdout line is time-stamped for the phase breakdown."""
        argv = seed.argv(host.hostname, host.addr, server=self.control_plane.address, pki_dir=self.pki_dir,
                         binary=self.operator_binary, release_url=self.release_url, ssh_user=SSH_USER, ssh_wait=SSH_WAIT)
        start = time.monotonic()
        lines: list[tuple[float, str]] = []
        with open(log, "w") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd="/")
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append((time.monotonic(), line.rstrip("\n")))
            rc = proc.wait()
        end = time.monotonic()
        with open(log, "a") as out:
            out.write("\n--- stdout ---\n" + "\n".join(text for _, text in lines) + f"\n--- rc={rc} ---\n")
        return {"rc": rc, "phases": script_phases(lines, start, end)}

    def baseline(self, size: int, hosts: Sequence[Any], parallel_run: bool) -> Result:
        mode = "parallel" if parallel_run else "sequential"
        with self.openssh_env() as env:
            def action() -> tuple[bool, dict[str, Any]]:
                jobs = [lambda h=h: self.run_script(h, env, self.log_dir / f"n{size}-baseline-{mode}-{h.hostname}.log")
                        for h in hosts]
                runs = parallel(jobs) if parallel_run else [job() for job in jobs]
                failed = [h.hostname for h, r in zip(hosts, runs, strict=True) if r["rc"] != 0]
                phases: dict[str, list[float]] = {}
                for r in runs:
                    for name, seconds in r["phases"].items():
                        phases.setdefault(name, []).append(seconds)
                detail: dict[str, Any] = {"phases_mean_s": {k: statistics.fmean(v) for k, v in phases.items()}}
                if failed:
                    detail["note"] = f"failed: {', '.join(failed)} (see {self.log_dir})"
                return not failed, detail

            return self.measure(size, f"baseline script, {mode}", hosts, action, agents=True)

    # ----------------------------------------------------------------- pulumi

    def new_stack(self, name: str, project: Path = REPO, extra_env: dict[str, str] | None = None) -> LabStack:
        """A stack of `project` in its own work dir, run by the bench's engine with the package snapshot first."""
        from lab.stack import LabStack, engine_env

        assert self.engine_bin is not None
        env = engine_env(self.engine_bin, WORK / "pulumi-home", WORK / "state")
        env["PATH"] = f"{self.engine_dir}:{env['PATH']}"  # the wrappers before the real engine
        env["PYTHONPATH"] = str(self.snapshot)
        env.update(self.engine_env)
        env.update(extra_env or {})
        return LabStack(WORK / "projects" / name, name, env, project=project)

    def empty_project(self) -> Path:
        """The repository's Pulumi.yaml beside a __main__.py that registers nothing: the engine's own floor."""
        project = WORK / "empty-project"
        shutil.rmtree(project, ignore_errors=True)
        project.mkdir(parents=True)
        shutil.copy2(REPO / "Pulumi.yaml", project / "Pulumi.yaml")
        (project / "__main__.py").write_text(
            '"""Registers nothing (bench/onboard.py): `pulumi up` of it is what the engine costs on its own."""\n')
        return project

    def stack_config(self, nodes: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """Like stacks/Pulumi.local.yaml, for (node id, address) pairs of this lab."""
        return {
            "pkiDir": str(self.pki_dir),
            "servers": [self.control_plane.address],
            "agent": {"version": RELEASE, "releaseUrl": self.release_url, "releaseCa": str(self.pki_dir / "ca.pem")},
            "ssh": {"user": SSH_USER, "privateKeyPath": str(self.lab.ssh_key_path), "wait": SSH_WAIT},
            "nodes": [{"id": node_id, **self.route(address)} for node_id, address in nodes],
        }

    def route(self, address: str) -> dict[str, Any]:
        """How the stack reaches a host: its own address, or its proxy on loopback while the runs are proxied."""
        if address in self.routes:
            return {"address": LOOPBACK, "port": self.routes[address]}
        return {"address": address}

    def route_through_proxies(self, hosts: Sequence[Any], rtt_ms: int) -> None:
        """From now on reach `hosts` through their toxiproxy proxies, with `rtt_ms` added to each round trip."""
        from bench.toxiproxy import Toxiproxy

        if self.toxiproxy is None:
            self.toxiproxy = Toxiproxy(self.tools_dir / "toxiproxy-server", self.log_dir / "toxiproxy.log").start()
        for h in hosts:
            if h.addr not in self.routes:
                self.routes[h.addr] = self.toxiproxy.proxy(h.hostname, h.addr)
            self.toxiproxy.set_latency(h.hostname, rtt_ms // 2)
        self.delay_ms = rtt_ms

    def route_directly(self) -> None:
        self.routes.clear()
        self.delay_ms = 0

    def engine_run(self, stack: LabStack, command: str, log_name: str) -> tuple[bool, dict[str, Any]]:
        """One engine command (`pulumi <command>`) on `stack`, with its per-step timing; output and events go to logs."""
        steps = EngineSteps()
        run = getattr(stack, command)(on_event=steps)
        (self.log_dir / f"{log_name}.log").write_text(run.output)
        (self.log_dir / f"{log_name}.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in run.events))
        detail: dict[str, Any] = {
            "steps": steps.by_type(),
            "max_in_flight": steps.max_in_flight(),
            "changes": steps.changes,
            "remote_ops": steps.remote_ops(),
            "timeline": steps.timeline(),
            "chains": steps.chains(transport_idle_seconds()),
        }
        if not run.ok:
            detail["note"] = f"FAILED (see {self.log_dir / (log_name + '.log')}): " + run.output.strip()[-300:]
        return run.ok, detail

    def pulumi_runs(self, size: int, hosts: Sequence[Any], then: Sequence[str] = ("noop", "preview", "refresh", "empty"),
                    ) -> None:
        """`pulumi up` from scratch, then on the onboarded fleet the runs named in `then`, in that order."""
        tag = f"n{size}" + (f"d{self.delay_ms}" if self.delay_ms else "") + (f"s{self.shards}" if self.shards else "")
        from llmgw_pulumi.shards import SHARDS_ENV

        stack = self.new_stack(f"bench-{tag}", extra_env={SHARDS_ENV: str(self.shards)} if self.shards else None)
        stack.set_config(self.stack_config([(h.hostname, h.addr) for h in hosts]))
        up = self.measure(size, "pulumi up, from scratch", hosts,
                          lambda: self.engine_run(stack, "up", f"{tag}-up"), agents=True)
        if not up.ok:
            return
        # As `pulumi stack export` prints it: secrets stay encrypted, as in the stored state.
        up.state = state_size(json.loads(stack.export_raw())["deployment"], size)
        if "noop" in then:
            self.repeated(size, "pulumi up, no-op", hosts, lambda i: self.engine_run(stack, "up", f"{tag}-noop-{i}"))
        if "preview" in then:
            self.measure(size, "pulumi preview", hosts, lambda: self.engine_run(stack, "preview", f"{tag}-preview"))
        if "refresh" in then:
            self.measure(size, "pulumi refresh", hosts, lambda: self.engine_run(stack, "refresh", f"{tag}-refresh"))
        if "empty" not in then:
            return
        empty = self.new_stack(f"empty-{tag}", project=self.empty_project())
        first = empty.up()  # creates the stack resource; the measured ups after it change nothing, like a no-op up
        if not first.ok:
            print(f"  empty stack: first up FAILED: {first.output[-300:]}")
            return
        self.repeated(size, "pulumi up, empty stack", hosts, lambda i: self.engine_run(empty, "up", f"{tag}-empty-{i}"))

    def repeated(self, size: int, scenario: str, hosts: Sequence[Any],
                 action: Callable[[int], tuple[bool, dict[str, Any]]]) -> Result:
        """Run a short scenario `repeats` times and keep the run with the median wall time."""
        runs = []
        for i in range(self.repeats):
            runs.append(self.measure(size, f"{scenario} #{i + 1}", hosts, lambda i=i: action(i)))
            self.results.pop()
        runs.sort(key=lambda r: r.wall)
        chosen = runs[len(runs) // 2]
        chosen.scenario = re.sub(r" #\d+", "", chosen.scenario)
        if len(runs) > 1:
            times = ", ".join(f"{r.wall:.2f}" for r in runs)
            chosen.note = (chosen.note + f" median of {len(runs)}: {times} s").strip()
        chosen.detail["all_walls"] = [r.wall for r in runs]
        self.results.append(chosen)
        return chosen

    # ----------------------------------------------------------------- the floor

    def stage_agent_files(self, hosts: Sequence[Any]) -> None:
        """Write from outside every file onboarding installs, so only the unavoidable steps remain."""
        from lab import pki as labpki
        from lab.doubles.llmgw import build_llmgw

        ca = (self.pki_dir / "ca.pem").read_bytes()
        binary = build_llmgw(RELEASE)
        unit = seed_unit().encode()
        issued = WORK / "floor-certs"
        for h in hosts:
            cert, key = labpki.issue_client_cert(self.pki_dir, issued, h.hostname)
            config = (f"# {h.hostname}, staged by bench/onboard.py.\nserver: \"{self.control_plane.address}\"\n\n"
                      "tls:\n  ca: /etc/llmgw/ca.pem\n  cert: /etc/llmgw/agent.pem\n  key: /etc/llmgw/agent-key.pem\n")
            for path, data, mode in [
                ("etc/llmgw/ca.pem", ca, 0o644),
                ("etc/llmgw/agent.pem", cert.read_bytes(), 0o644),
                ("etc/llmgw/agent-key.pem", key.read_bytes(), 0o600),
                ("etc/llmgw/agent.yaml", config.encode(), 0o644),
                ("usr/local/share/ca-certificates/llmgw-ca.crt", ca, 0o644),
                ("usr/local/bin/llmgw", binary, 0o755),
                ("etc/systemd/system/llmgw-agent.service", unit, 0o644),
            ]:
                target = h.root / path
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
                target.write_bytes(data)
                os.chmod(target, mode)
                os.chown(target, 0, 0)
        shutil.rmtree(issued, ignore_errors=True)

    def ssh_all(self, hosts: Sequence[Any], command: str, env: dict[str, str]) -> tuple[bool, dict[str, Any]]:
        """`command` on every host at once, one OpenSSH connection each, with the script's options."""
        opts = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=accept-new"]
        procs = [subprocess.Popen(["ssh", *opts, f"{SSH_USER}@{h.addr}", command], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for h in hosts]
        errors = [(h.hostname, p.communicate()[1].strip()) for h, p in zip(hosts, procs, strict=True)]
        failed = [f"{name}: {err[-200:]}" for (name, err), p in zip(errors, procs, strict=True) if p.returncode != 0]
        return not failed, ({"note": "; ".join(failed)} if failed else {})

    def floor(self, size: int, hosts: Sequence[Any]) -> None:
        self.stage_agent_files(hosts)
        self.quiesce()
        # A longer idle window than the quiesce's: the floor's CPU is small, so its idle share matters.
        c0 = Counters.now()
        time.sleep(5.0)
        d = Counters.now() - c0
        idle, idle_own = d.machine / d.wall, (d.operator + d.hosts) / d.wall
        with self.openssh_env() as env:
            steps = [
                ("floor: 1 SSH connection (`true`)", "true", False),
                (FLOOR, "sudo -n update-ca-certificates >/dev/null 2>&1 && "
                        "sudo -n systemctl enable --now llmgw-agent >/dev/null 2>&1", True),
            ]
            for scenario, command, agents in steps:
                r = self.measure(size, scenario, hosts, lambda c=command: self.ssh_all(hosts, c, env),
                                 agents=agents, quiet_first=True)
                r.idle_rate, r.idle_own_rate = idle, idle_own

    # ----------------------------------------------------------------- everything for one size

    def run_size(self, size: int) -> None:
        """Plain bridge: both baselines, the pulumi runs and the floor."""
        print(f"\n== N = {size}, plain bridge", flush=True)
        hosts = self.fresh_hosts(size)
        self.baseline(size, hosts, parallel_run=False)
        hosts = self.fresh_hosts(size)
        self.baseline(size, hosts, parallel_run=True)
        hosts = self.fresh_hosts(size)
        self.pulumi_runs(size, hosts)
        hosts = self.fresh_hosts(size)
        self.floor(size, hosts)

    def run_latency(self, size: int, rtt_ms: int = 2 * DELAY_MS) -> None:
        """Through the proxies with `rtt_ms` added: both baselines, `pulumi up` and `pulumi refresh`."""
        print(f"\n== N = {size}, +{rtt_ms} ms RTT through toxiproxy", flush=True)
        try:
            for runs in ("sequential", "parallel", "pulumi"):
                hosts = self.fresh_hosts(size)
                self.route_through_proxies(hosts, rtt_ms)
                if runs == "pulumi":
                    self.pulumi_runs(size, hosts, then=("refresh",))
                else:
                    self.baseline(size, hosts, parallel_run=runs == "parallel")
        finally:
            self.route_directly()

    def run_scale(self, size: int) -> None:
        """Plain bridge, no baseline: `pulumi up` from scratch, no-op up, preview, refresh."""
        print(f"\n== N = {size}, scale" + (", hosts trusting 3 system CAs" if self.reduced_ca else ""), flush=True)
        hosts = self.fresh_hosts(size, reduced_ca=self.reduced_ca)
        first = len(self.results)
        self.pulumi_runs(size, hosts, then=("noop", "preview", "refresh"))
        if self.reduced_ca:
            for r in self.results[first:]:
                r.reduced_ca = True
                r.note = (r.note + " hosts trust 3 system CAs (--reduced-ca)").strip()

    def run_shards(self, size: int) -> None:
        """`pulumi up` from scratch with each provider-process count."""
        for k in self.shard_counts:
            print(f"\n== N = {size}, {k} provider processes", flush=True)
            hosts = self.fresh_hosts(size)
            self.shards = k
            try:
                self.pulumi_runs(size, hosts, then=())
            finally:
                self.shards = None

    def run_signers(self, size: int) -> None:
        """`pulumi up` from scratch with the pkiDir default, then on fresh hosts with the HSM signer; then the
        signing step alone (bench/signer.py) for both, `size` certificates one after another.

        The HSM is lab.hsm's SoftHSM2 token (CA key made inside it, non-extractable), signing through
        examples/signers/openssl-pkcs11.sh with maxParallel 1 (SoftHSM2 fails concurrent processes). Its nodes trust
        the token's CA only, so their agents connect to a second control plane whose certificate the token signed.
        Both ups fetch the release on the operator's side (`fetch: operator`, each from an empty release cache): the
        HSM's nodes do not trust the lab CA that signed the release server's certificate.
        """
        from bench import signer as signer_bench
        from lab.control_plane import ControlPlane
        from lab.hsm import SIGNER, Token

        shutil.rmtree(WORK / "hsm", ignore_errors=True)
        token = Token.create(WORK / "hsm")
        plane_pki = WORK / "hsm-plane"
        shutil.rmtree(plane_pki, ignore_errors=True)
        plane_pki.mkdir(parents=True)
        shutil.copy2(token.ca_pem, plane_pki / "ca.pem")
        default_plane = self.control_plane
        hsm_plane = ControlPlane(plane_pki, self.lab.gateway, server_cert=token.server_cert).start()
        hsm_signer = {"kind": "command", "ca": str(token.ca_pem), "command": [str(SIGNER)], "maxParallel": 1}
        ups: dict[str, Result] = {}
        try:
            for name, plane, env, chosen in (("pkiDir", default_plane, {}, None),
                                             ("HSM", hsm_plane, token.signer_env(), hsm_signer)):
                print(f"\n== N = {size}, pulumi up from scratch, signer {name}", flush=True)
                hosts = self.fresh_hosts(size)
                self.control_plane = plane
                cache = WORK / f"release-cache-{name}"
                shutil.rmtree(cache, ignore_errors=True)
                stack = self.new_stack(f"signer-{name}-n{size}", extra_env={**env, "XDG_CACHE_HOME": str(cache)})
                config = self.stack_config([(h.hostname, h.addr) for h in hosts])
                config["agent"]["fetch"] = "operator"
                if chosen is not None:
                    del config["pkiDir"]
                    config["signer"] = chosen
                stack.set_config(config)
                ups[name] = self.measure(size, f"{SIGNED_UP} {name}", hosts,
                                         partial(self.engine_run, stack, "up", f"n{size}-signer-{name}-up"),
                                         agents=True)
        finally:
            self.control_plane = default_plane
            hsm_plane.stop()
        saved = dict(os.environ)
        os.environ.update(token.signer_env())  # the signer command's environment, as `pulumi up` gave it
        try:
            alone = signer_bench.per_certificate(token, self.pki_dir, size)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        ups["pkiDir"].detail["signing_alone_s"] = alone[signer_bench.PKI_DIR]
        ups["HSM"].detail["signing_alone_s"] = alone[signer_bench.HSM]
        self.say(f"signing step alone, s per certificate: pkiDir {alone[signer_bench.PKI_DIR]:.4f}, "
                 f"HSM {alone[signer_bench.HSM]:.4f}")


    def run_languages(self, size: int) -> None:
        """`pulumi up` from scratch of the Python program, then on fresh hosts of bench/typescript-fleet (the Node
        component from TypeScript, set up as the README says: its npm packages, `pulumi package add`, the one
        setting), each onboarding `size` nodes of the same stack config."""
        from tests.e2e.test_languages import VIRTUALENV, dependencies, package_add

        _, node_modules = dependencies()
        for lang in LANGUAGES:
            print(f"\n== N = {size}, pulumi up from scratch, program in {lang}", flush=True)
            hosts = self.fresh_hosts(size)
            if lang == "Python":
                stack = self.new_stack(f"lang-python-n{size}")
            else:
                project = WORK / "typescript-fleet"
                shutil.rmtree(project, ignore_errors=True)
                shutil.copytree(REPO / "bench" / "typescript-fleet", project)
                for name in ("package.json", "package-lock.json"):
                    shutil.copy2(REPO / "examples" / "typescript-vm" / name, project / name)
                stack = self.new_stack(f"lang-typescript-n{size}", project=project, extra_env={
                    "PULUMI_RUNTIME_VIRTUALENV": VIRTUALENV, "npm_config_cache": str(CACHE / "npm"),
                    "npm_config_prefer_offline": "true"})
                subprocess.run(["cp", "-al", str(node_modules), str(stack.work_dir / "node_modules")], check=True)
                package_add(stack)
            stack.set_config(self.stack_config([(h.hostname, h.addr) for h in hosts]))
            self.measure(size, f"{LANGUAGE_UP} {lang}", hosts,
                         partial(self.engine_run, stack, "up", f"n{size}-language-{lang}-up"), agents=True)


def proxy_host_blocks(routes: dict[str, int]) -> str:
    """ssh_config Host blocks sending each host address to its proxy on loopback; the known_hosts name stays the address."""
    if not routes:
        return ""
    blocks = [f"Host {addr}\n  HostName {LOOPBACK}\n  Port {port}\n  HostKeyAlias {addr}\n"
              for addr, port in sorted(routes.items())]
    return "".join(blocks) + "Host *\n"


def reduce_ca_bundle(root: Path, keep: int = 3) -> None:
    """Make a host's /etc/ca-certificates.conf list only its first `keep` system CAs (--reduced-ca).

    update-ca-certificates then adds `keep` system CAs (plus the cluster's) to the
    bundle instead of all ~140, each of which costs it a few processes.
    """
    conf = root / "etc" / "ca-certificates.conf"
    lines = conf.read_text().splitlines()
    comments = [line for line in lines if line.startswith("#")]
    cas = [line for line in lines if line and not line.startswith(("#", "!"))][:keep]
    conf.write_text("\n".join([*comments, "# bench/onboard.py --reduced-ca: a reduced bundle", *cas]) + "\n")
    os.chmod(conf, 0o644)
    os.chown(conf, 0, 0)


def seed_unit() -> str:
    """The llmgw-agent unit exactly as the seed script writes it (its heredoc)."""
    text = SEED_SCRIPT.read_text()
    match = re.search(r"<<'UNIT'\n(.*?)\nUNIT\n", text, re.S)
    if match is None:
        raise RuntimeError(f"no UNIT heredoc in {SEED_SCRIPT}")
    return match.group(1) + "\n"


def script_phases(lines: list[tuple[float, str]], start: float, end: float) -> dict[str, float]:
    """Seconds spent in each phase of one onboard-node.sh run, from its progress lines."""
    marks: list[tuple[float, str]] = []
    phase_iter = iter(SCRIPT_PHASES)
    want = next(phase_iter, None)
    for i, (t, line) in enumerate(lines):
        if want is not None and line.startswith(want[0]):
            marks.append((start if not marks else t, want[1]))
            want = next(phase_iter, None)
            if want is None:  # the last phase ends at the next line (the blank one after it)
                following = lines[i + 1][0] if i + 1 < len(lines) else end
                marks.append((following, "_end"))
    out: dict[str, float] = {}
    for (t, name), (t_next, _) in zip(marks, marks[1:], strict=False):
        out[name] = t_next - t
    return out


def state_size(deployment: dict[str, Any], nodes: int) -> StateSize:
    """Bytes of the exported deployment JSON per node, with and without PEM bodies, and where they are."""
    text = json.dumps(deployment)
    no_pem = PEM_RE.sub("", text)
    size = lambda value: len(PEM_RE.sub("", json.dumps(value)))  # noqa: E731
    by_type: dict[str, int] = {}
    by_field: dict[str, int] = {}
    keys: dict[str, int] = {}
    secrets = 0
    for res in deployment.get("resources", []):
        t = short_type(res.get("type", "?"))
        by_type[t] = by_type.get(t, 0) + size(res)
        for name, value in res.items():
            by_field[name] = by_field.get(name, 0) + size(value)
        for section in ("inputs", "outputs"):
            for k, v in (res.get(section) or {}).items():
                key = f"{t}.{section}.{k}"
                keys[key] = keys.get(key, 0) + size(v)
        secrets += sum(len(m) for m in re.findall(r'"ciphertext": "[^"]*"', json.dumps(res)))
    biggest = sorted(keys.items(), key=lambda kv: -kv[1])[:10]
    return StateSize(len(text), len(no_pem), len(text) / nodes, len(no_pem) / nodes,
                     dict(sorted(by_type.items(), key=lambda kv: -kv[1])),
                     dict(sorted(by_field.items(), key=lambda kv: -kv[1])), biggest, secrets)


# --------------------------------------------------------------------------- report


def one_line(r: Result) -> str:
    agents = f", agents up {r.agents_up:.1f}s" if r.agents_up is not None else ""
    state = (f", state {r.state.per_node:.0f} B/node ({r.state.per_node_no_pem:.0f} w/o PEM)"
             if r.state else "")
    status = "" if r.ok else "  FAILED"
    note = f"  [{r.note}]" if r.note else ""
    return (f"N={r.size} {r.scenario}: {r.wall:.2f}s wall, {r.ssh} SSH, CPU {r.cpu.machine:.1f}s machine, "
            f"{r.cpu_own:.1f}s ours + hosts = {cpu_split(r.cpu)}{agents}{state}{status}{note}")


def cpu_split(c: Counters) -> str:
    """Where the CPU-s of ours + hosts went."""
    return (f"this process & scripts/ssh {c.bench_process:.1f} + engine CLI {c.engine:.1f} "
            f"+ language host & program {c.program:.1f} + provider {c.provider:.1f} + hosts {c.hosts:.1f}")


def machine_description() -> dict[str, str]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "?")
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    return {"nproc": str(os.cpu_count()), "memory": f"{mem_kb / 1024 / 1024:.1f} GiB", "kernel": platform.release(),
            "cpu": model, "openssh": ssh_v}


def is_floor(r: Result) -> bool:
    return r.scenario.startswith("floor")


def own_cpu(r: Result) -> float:
    """Ours + hosts CPU-s; for floor rows net of what the same spends idle."""
    return r.cpu_own_net if is_floor(r) else r.cpu_own


def table(results: Sequence[Result]) -> str:
    rows = ["| N | run | wall s | SSH conns | SSH/node | CPU-s machine | CPU-s ours + hosts "
            "| CPU-s/node (ours + hosts) | other work CPU-s/s | agents up s | state B/node (w/o PEM) | notes |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        mark = "*" if is_floor(r) else ""
        state = f"{r.state.per_node:,.0f} ({r.state.per_node_no_pem:,.0f})" if r.state else ""
        agents = f"{r.agents_up:.1f}" if r.agents_up is not None else ""
        other = (r.cpu.machine - r.cpu_own) / r.cpu.wall if r.cpu.wall > 0 else 0.0
        note = ("FAILED " if not r.ok else "") + r.note.replace("|", "/")
        rows.append(f"| {r.size} | {r.scenario} | {r.wall:.2f} | {r.ssh} | {r.ssh / r.size:.1f} "
                    f"| {r.cpu.machine:.1f} | {own_cpu(r):.1f}{mark} ({r.cpu.operator:.1f} + {r.cpu.hosts:.1f}) "
                    f"| {own_cpu(r) / r.size:.2f}{mark} | {other:.2f} | {agents} | {state} | {note} |")
    return "\n".join(rows)


@dataclass
class Ratio:
    name: str
    value: float | None
    target: str
    met: bool | None
    how: str


def ratios(results: Sequence[Result], sizes: Sequence[int]) -> list[Ratio]:
    """The figures issue 6 sets targets for, at the smallest and largest size measured."""
    def get(size: int, scenario: str) -> Result | None:
        return next((r for r in results if r.size == size and r.scenario == scenario and r.ok), None)

    if not sizes:
        return []
    lo, hi = min(sizes), max(sizes)
    out: list[Ratio] = []

    def add(name: str, num: float | None, den: float | None, target: str, ok: Callable[[float], bool] | None,
            how: str = "") -> None:
        value = None if num is None or not den else num / den
        out.append(Ratio(name, value, target, None if value is None or ok is None else ok(value), how))

    up_hi, up_lo = get(hi, "pulumi up, from scratch"), get(lo, "pulumi up, from scratch")
    seq, par = get(hi, "baseline script, sequential"), get(hi, "baseline script, parallel")
    noop, empty = get(hi, "pulumi up, no-op"), get(hi, "pulumi up, empty stack")
    floor = get(hi, FLOOR)
    wall = lambda r: r.wall if r else None  # noqa: E731
    own = lambda r: r.cpu_own if r else None  # noqa: E731
    machine = lambda r: r.cpu.machine if r else None  # noqa: E731
    add(f"pulumi up time, {hi} nodes / {lo} node(s)", wall(up_hi), wall(up_lo), "<= 3", lambda v: v <= 3)
    add(f"baseline sequential wall / pulumi up time, {hi} nodes", wall(seq), wall(up_hi), ">= 8", lambda v: v >= 8)
    add(f"baseline parallel wall / pulumi up time, {hi} nodes", wall(par), wall(up_hi), ">= 2", lambda v: v >= 2)
    for base, label in ((seq, "sequential"), (par, "parallel")):
        add(f"CPU-s per node, pulumi up / baseline {label}, {hi} nodes: ours + hosts", own(up_hi), own(base),
            "<= 0.5", lambda v: v <= 0.5, "this process's cgroup (engine, program, provider, scripts, ssh) + the hosts' cgroups")
        add(f"CPU-s per node, pulumi up / baseline {label}, {hi} nodes: machine", machine(up_hi), machine(base),
            "<= 0.5", lambda v: v <= 0.5, "whole machine, other work on it included")
    operator = lambda r: r.cpu.operator if r else None  # noqa: E731
    hosts = lambda r: r.cpu.hosts if r else None  # noqa: E731
    for base, label in ((seq, "sequential"), (par, "parallel")):
        add(f"CPU-s per node on the operator's side, pulumi up / baseline {label}, {hi} nodes", operator(up_hi),
            operator(base), "(info)", None, "this process's cgroup only: what a real operator machine pays")
        add(f"CPU-s per node on the hosts, pulumi up / baseline {label}, {hi} nodes", hosts(up_hi), hosts(base),
            "(info)", None, "the hosts' cgroups only: what each real node pays")
    add(f"no-op up time, {hi} nodes / empty-stack up time", wall(noop), wall(empty), "<= 1.2", lambda v: v <= 1.2,
        "medians")
    out.append(Ratio(f"SSH connections of a no-op up, {hi} nodes", float(noop.ssh) if noop else None, "0",
                     None if noop is None else noop.ssh == 0, ""))
    for size in sorted(sizes):
        up = get(size, "pulumi up, from scratch")
        add(f"SSH connections per node per up, {size} node(s)", up.ssh if up else None, size, "1 (aim)",
            lambda v: v <= 1)
        if up and up.remote_ops:
            add(f"SSH connections per remote resource operation, {size} node(s)", up.ssh, up.remote_ops, "<= 1",
                lambda v: v <= 1, f"{up.remote_ops} operations on " + "/".join(REMOTE_TYPES))
    if up_hi and up_hi.state:
        out.append(Ratio(f"state bytes per node without PEM bodies, {hi} nodes", up_hi.state.per_node_no_pem,
                         "<= 4096", up_hi.state.per_node_no_pem <= 4096, ""))
    add(f"pulumi up CPU-s / floor CPU-s, {hi} nodes, ours + hosts", own(up_hi), floor.cpu_own_net if floor else None,
        "(info)", None, "floor: update-ca-certificates + starting the agent over 1 SSH connection, idle-corrected")
    add(f"baseline parallel CPU-s / floor CPU-s, {hi} nodes, ours + hosts", own(par),
        floor.cpu_own_net if floor else None, "(info)", None)
    nproc = os.cpu_count() or 1
    # The hosts share this machine's CPUs, so the floor's CPU / nproc bounds any up time here from below.
    floor_wall = max(floor.cpu_own_net / nproc, floor.wall) if floor else None
    how = (f"floor at {hi}: max(its CPU-s / {nproc} CPUs, its own wall) = {floor_wall:.1f}s" if floor and floor_wall
           else "no floor measured")
    add(f"least possible up time at {hi} nodes (the floor) / pulumi up time at {lo}", floor_wall, wall(up_lo),
        "(info)", None, how + "; compare with the <= 3 target")
    add(f"baseline sequential wall / least possible up time at {hi} nodes", wall(seq), floor_wall, "(info)", None,
        "the most speed-up over the sequential baseline this machine allows (target >= 8)")
    add(f"baseline parallel wall / least possible up time at {hi} nodes", wall(par), floor_wall, "(info)", None,
        "the same against the parallel baseline (target >= 2)")
    return out


def ratio_table(items: Sequence[Ratio]) -> str:
    rows = ["| ratio | value | target | met | how |", "|---|---:|---:|:---:|---|"]
    for r in items:
        value = "n/a" if r.value is None else f"{r.value:.2f}"
        met = "" if r.met is None and r.target == "(info)" else (
            "n/a" if r.met is None else ("yes" if r.met else "**no**"))
        rows.append(f"| {r.name} | {value} | {r.target} | {met} | {r.how} |")
    return "\n".join(rows)


def where_time_goes(results: Sequence[Result]) -> str:
    """Step timings of the engine runs and the script's phases, as text."""
    lines = []
    for r in results:
        if "timeline" in r.detail:
            tl = ", ".join(f"{k} {v:.1f}s" for k, v in r.detail["timeline"].items())
            lines.append(f"- N={r.size} {r.scenario}: {r.wall:.2f}s. Engine events at: {tl}. "
                         f"At most {r.detail.get('max_in_flight')} provider steps in flight; "
                         f"changes {r.detail.get('changes')}")
            ch = r.detail.get("chains") or {}
            if ch:
                lines.append(f"  - per node, certificate -> engine check: mean {ch['chain_mean_s']:.1f}s, max "
                             f"{ch['chain_max_s']:.1f}s; NodeIdentity end -> AgentInstall start: max "
                             f"{ch['identity_to_agent_gap_max_s']:.1f}s, {ch['gaps_over_idle']:.0f} node(s) over the "
                             f"transport's {ch['idle_seconds']:g}s idle limit (a pooled SSH connection closed)")
            for key, st in r.detail.get("steps", {}).items():
                if key.split()[0] in ("Stack", "Node", "pulumi-python"):
                    continue
                lines.append(f"  - {key}: {st['count']:.0f} steps, mean {st['mean_s']:.2f}s, max {st['max_s']:.2f}s, "
                             f"from {st['first_start_s']:.1f}s to {st['last_end_s']:.1f}s")
        elif "phases_mean_s" in r.detail:
            phases = ", ".join(f"{k} {v:.2f}s" for k, v in r.detail["phases_mean_s"].items())
            lines.append(f"- N={r.size} {r.scenario}: {r.wall:.2f}s; per node, mean: {phases}")
    return "\n".join(lines)


def cpu_breakdown(results: Sequence[Result]) -> str:
    """CPU-s of each run split by cgroup, and the rest of the machine."""
    rows = ["| N | run | this process, scripts, ssh | engine CLI | language host + program | provider | hosts "
            "| other work on the machine |",
            "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        c = r.cpu
        rows.append(f"| {r.size} | {r.scenario} | {c.bench_process:.1f} | {c.engine:.1f} | {c.program:.1f} | {c.provider:.1f} "
                    f"| {c.hosts:.1f} | {c.machine - r.cpu_own:.1f} |")
    return "\n".join(rows)


def state_breakdown(results: Sequence[Result]) -> str:
    lines = []
    for r in results:
        if r.state is None:
            continue
        s, n = r.state, r.size
        fmt = lambda items, n=n: ", ".join(f"{k} {b / n:,.0f}" for k, b in items)  # noqa: E731
        lines.append(f"- N={n}: {s.total:,} B in all, {s.total_no_pem:,} without PEM bodies; per node without PEM:\n"
                     f"  - by resource type: {fmt(s.by_type_no_pem.items())}\n"
                     f"  - by field of a resource: {fmt(s.by_field_no_pem.items())}\n"
                     f"  - encrypted secrets (ciphertext): {s.secret_ciphertext / n:,.0f}\n"
                     f"  - biggest input/output values: {fmt(s.biggest_keys_no_pem)}")
    return "\n".join(lines)



# --------------------------------------------------------------------------- issue 12: targets, growth, plots

UP, NOOP, PREVIEW, REFRESH = PLOTTED[2], PLOTTED[1], PLOTTED[0], PLOTTED[3]
SEQ, PAR = "baseline script, sequential", "baseline script, parallel"


def find(results: Sequence[Result], size: int, kind: str, delay_ms: int = 0, shards: int | None = None,
         full_ca: bool = False) -> Result | None:
    """The successful run of `kind` at `size` with this delay and provider count (and the full CA bundle)."""
    return next((r for r in results if r.ok and r.size == size and r.kind == kind and r.delay_ms == delay_ms
                 and r.shards == shards and not (full_ca and r.reduced_ca)), None)


def operator_cpu(r: Result) -> float:
    """Engine + provider + language host and program CPU-s: what the operator's machine spends on a pulumi run."""
    return r.cpu.engine + r.cpu.provider + r.cpu.program


def issue12_targets(results: Sequence[Result]) -> list[Target]:
    """Issue 12's targets as ratios from this run's results (None where the run was not measured)."""
    n, big, rtt = TARGET_N, SCALE_N, 2 * DELAY_MS
    get = lambda size, kind, delay=0: find(results, size, kind, delay)  # noqa: E731
    wall = lambda r: r.wall if r else None  # noqa: E731
    secs = lambda *rs: " / ".join("n/a" if r is None else f"{r.wall:.1f} s" for r in rs)  # noqa: E731
    up, floor = find(results, n, UP, full_ca=True), get(n, FLOOR)  # the floor's hosts keep the full bundle
    up_d, par_d, seq_d = get(n, UP, rtt), get(n, PAR, rtt), get(n, SEQ, rtt)
    out = [
        Target(f"{n} nodes: pulumi up / floor", ratio(wall(up), wall(floor)), 1.25, measured=secs(up, floor)),
        Target(f"{n} nodes, +{rtt} ms: script parallel / up", ratio(wall(par_d), wall(up_d)), 2.5, at_least=True,
               measured=secs(par_d, up_d)),
        Target(f"{n} nodes, +{rtt} ms: script sequential / up", ratio(wall(seq_d), wall(up_d)), 8, at_least=True,
               measured=secs(seq_d, up_d)),
        Target(f"{n} nodes: operator CPU-s per node (up)", None if up is None else operator_cpu(up) / n, 0.3,
               measured="" if up is None else (f"engine {up.cpu.engine:.1f} + provider {up.cpu.provider:.1f} "
                                               f"+ program {up.cpu.program:.1f} CPU-s")),
    ]
    for kind, short in ((NOOP, "no-op up"), (PREVIEW, "preview")):
        r30, r100 = get(n, kind), get(big, kind)
        out.append(Target(f"{big} nodes: {short}, s", wall(r100), 10, measured=secs(r100)))
        k = growth.exponent([(n, r30.wall), (big, r100.wall)]) if r30 and r100 else None
        out.append(Target(f"{n}->{big} nodes: {short} growth exponent", k, 1.0, measured=secs(r30, r100)))
    for size in (n, big):
        r = get(size, UP)
        out.append(Target(f"{size} nodes: SSH connections per node per up", None if r is None else r.ssh / size, 1.0,
                          measured="" if r is None else f"{r.ssh} connections"))
    with_state = [r for r in results if r.state is not None and r.delay_ms == 0 and r.shards is None]
    largest = max(with_state, key=lambda r: r.size, default=None)
    out.append(Target(f"{largest.size if largest else n} nodes: state B/node w/o PEM",
                      largest.state.per_node_no_pem if largest and largest.state else None, STATE_LIMIT,
                      measured="" if largest is None or largest.state is None
                      else f"{largest.state.per_node:,.0f} B/node with PEM bodies"))
    return out


def growth_figures(results: Sequence[Result]) -> list[growth.Figure]:
    """Each figure against N, one series per plotted run (plain bridge, default provider count)."""
    runs = [r for r in results if r.ok and r.delay_ms == 0 and r.shards is None and r.kind in PLOTTED]

    def series(value: Callable[[Result], float]) -> dict[str, list[tuple[float, float]]]:
        return {kind: sorted((r.size, value(r)) for r in runs if r.kind == kind) for kind in PLOTTED}

    ups = [r for r in runs if r.kind == UP and r.state]
    return [
        growth.Figure("wall", "Wall time of each pulumi run", "wall time, s", series(lambda r: r.wall)),
        growth.Figure("engine-cpu", "Engine CPU (the pulumi CLI)", "CPU-s", series(lambda r: r.cpu.engine)),
        growth.Figure("provider-cpu", "Provider CPU (dynamic-provider processes)", "CPU-s",
                      series(lambda r: r.cpu.provider)),
        growth.Figure("program-cpu", "Program CPU (language host + __main__.py)", "CPU-s",
                      series(lambda r: r.cpu.program)),
        growth.Figure("state", "State size after pulumi up (exported deployment)", "bytes", {
            "with PEM bodies": sorted((r.size, float(r.state.total)) for r in ups if r.state),
            "without PEM bodies": sorted((r.size, float(r.state.total_no_pem)) for r in ups if r.state)}),
    ]


def growth_table(figures: Sequence[growth.Figure]) -> str:
    rows = [f"| figure | run | exponent from {growth.FROM} nodes | exponent, all sizes | points (N: value) |",
            "|---|---|---:|---:|---|"]
    for fig in figures:
        for kind, g in fig.growths().items():
            flag = " **superlinear**" if g.superlinear() else ""
            pts = ", ".join(f"{n:g}: {y:,.3g}" for n, y in fig.series[kind])
            rows.append(f"| {fig.title} | {kind} | {fmt(g.large)}{flag} | {fmt(g.overall)} | {pts} |")
    return "\n".join(rows)


def superlinear_notes(figures: Sequence[growth.Figure]) -> list[str]:
    return [f"superlinear from {growth.FROM} nodes: {fig.slug} of {kind} (k={g.large:.2f})"
            for fig in figures for kind, g in fig.growths().items() if g.superlinear() and g.large is not None]


def shard_comparison(results: Sequence[Result]) -> tuple[str, list[str]]:
    """`pulumi up` from scratch per provider-process count: a table, and the best count per size."""
    runs = [r for r in results if r.kind == UP and r.shards is not None and r.delay_ms == 0]
    if not runs:
        return "(not measured)", []
    rows = ["| N | provider processes | wall s | operator CPU-s | provider CPU-s | SSH/node |", "|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for size in sorted({r.size for r in runs}):
        at = sorted((r for r in runs if r.size == size), key=lambda r: r.shards or 0)
        rows += [f"| {size} | {r.shards} | {r.wall:.2f} | {operator_cpu(r):.1f} | {r.cpu.provider:.1f} "
                 f"| {r.ssh / size:.2f} |" for r in at if r.ok]
        ok = [r for r in at if r.ok]
        if ok:
            best = min(ok, key=lambda r: r.wall)
            notes.append(f"providers at {size} nodes: " + ", ".join(f"{r.shards}: {r.wall:.1f} s" for r in ok)
                         + f"; best {best.shards}")
    return "\n".join(rows), notes


def draw_plots(figures: Sequence[growth.Figure], out_dir: Path) -> list[Path]:
    """The PNGs beside the report; none (and a message) when matplotlib is missing."""
    try:
        return [growth.plot(fig, out_dir) for fig in figures if any(len(p) > 1 for p in fig.series.values())]
    except ImportError as exc:
        print(f"no plots: {exc} (scripts/bench-tools.sh installs matplotlib)", flush=True)
        return []


def latency_method(bench: Bench) -> str:
    if not bench.latency_sizes:
        return "No runs with added latency (--latency-sizes was empty)."
    return (f"Runs marked *+{2 * DELAY_MS} ms RTT* go through toxiproxy-server (v2.5.0, built by "
            "scripts/bench-tools.sh) on loopback: one proxy per host (127.0.0.1:<port> -> host:22) with a "
            f"{DELAY_MS} ms latency toxic upstream and one downstream. The seed script's ssh/scp (ssh_config "
            "HostName/Port/HostKeyAlias per host address) and the stack (node address 127.0.0.1 and the proxy's "
            "port; the node id and hostname stay the node's own) use the same proxies. Only operator -> sshd "
            "traffic is delayed: the release download and the agents' streams to the control plane go from the "
            "hosts over the bridge, unproxied. The 0 ms figures are the plain-bridge runs (no proxy); the "
            "headline (target 1) is plain bridge.")


def render(bench: Bench, machine: dict[str, str], fingerprint: str, started: str, seconds: float,
           command: str, plots: Sequence[Path] = ()) -> str:
    figures = growth_figures(bench.results)
    shard_rows, shard_notes = shard_comparison(bench.results)
    pictures = "\n".join(f"![{p.stem}]({p.name})" for p in plots) or "(no plots: matplotlib missing or too few sizes)"
    reduced = ("The scale runs' hosts trusted 3 system CAs (--reduced-ca: their /etc/ca-certificates.conf lists 3, "
               "so update-ca-certificates rebuilds a 4-CA bundle); the 1-30 node runs use the full bundle."
               if bench.reduced_ca and bench.scale_sizes else
               "Every host keeps Debian's full CA bundle (no --reduced-ca).")
    return f"""# Onboarding benchmark (issues 6 and 12)

Generated by `{command}` ({started}, {seconds / 60:.1f} min). Measurement only, never a
pass/fail test; see the docstring of `bench/onboard.py` for what each run does and why.

To run it: `scripts/install.sh && sudo .venv/bin/python -m bench.onboard` (the full run:
plain bridge and +{2 * DELAY_MS} ms at 1, 10, 30 nodes, scale at 100 and 200, provider
processes 4, 8, 16 at 30 and 100, pkiDir beside the HSM signer at 30; about {full_run_minutes():.0f} min on 2 CPUs),
or `--quick` (about 3 min).
It builds toxiproxy-server and installs matplotlib on first use (scripts/bench-tools.sh,
cached under /var/cache/llmgw-pulumi); `--render <logs>/results.json` rewrites this page
and its plots from an earlier run. The plots are the `benchmark-*.png` files beside it.

Machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['memory']} memory, kernel {machine['kernel']},
{machine['openssh']}. Package measured: {fingerprint}; {bench.imports}. Lab hosts: systemd-nspawn containers
booting Debian 12 systemd on one bridge; every scenario starts on freshly booted hosts.
Sizes: plain bridge {list_text(bench.sizes)}; +{2 * DELAY_MS} ms RTT {list_text(bench.latency_sizes)}; scale
{list_text(bench.scale_sizes)} (no baseline at scale); provider processes {list_text(bench.shard_counts)} at
{list_text(bench.shard_sizes)} nodes.{engine_env_text(bench.engine_env)}

{latency_method(bench)}

{reduced}

*The floor* ({FLOOR}): the hosts' unavoidable work, with every file staged from outside
on fresh hosts: `sudo update-ca-certificates && sudo systemctl enable --now llmgw-agent`
over one SSH connection per node, all nodes at once, until every agent's stream is accepted.

## Issue 12 targets

```
{summary(issue12_targets(bench.results), shard_notes)}
```

## Growth with N

Least-squares fit of log(figure) on log(N) (plain bridge, the package's default provider
count), from {growth.FROM} nodes to the largest and over all sizes; above 1.0 grows faster
than linearly.

{growth_table(figures)}

{pictures}

## Provider processes

`pulumi up` from scratch with LLMGW_PROVIDER_SHARDS set (llmgw_pulumi/shards.py).

{shard_rows}

## Signing through an HSM

At {list_text(bench.signer_sizes)} nodes (--signer-sizes): `pulumi up` from scratch with the `pkiDir` default, then
on freshly booted hosts with the CA key in a SoftHSM2 token (`llmgw:signer` kind `command`,
examples/signers/openssl-pkcs11.sh, `maxParallel: 1`); both with `agent.fetch: operator`. See `Bench.run_signers`.

{signer_comparison(bench.results)}

Columns: *SSH conns* = TCP connections the hosts accepted (sshd is their only listener).
*CPU-s machine* = busy time of all CPUs over the run (includes the hosts and anything
else the machine ran); an onboarding run's CPU window lasts until every agent's stream is
accepted (*agents up*). *ours + hosts* = this process with all its children (engine,
language host and program, provider, scripts, ssh, release server, control plane) + the
lab hosts' cgroups, shown as (ours + hosts); the rest of the machine total is other work
on the machine (e.g. other developers' labs), shown as *other work CPU-s/s* during the run
(2.0 = both CPUs busy with it: wall times are then inflated). *wall* of an engine run is
the one `pulumi up`/`preview`/`refresh` CLI call, run in the project directory as an
operator types it. `*` = floor rows: net of what ours + hosts spend idle over the same
time. No-op and empty-stack ups are the median of {bench.repeats} runs.

## Results

{table(bench.results)}

## Issue 6 ratios (for reference)

{ratio_table(ratios(bench.results, bench.sizes))}

## Where the time goes

Engine runs: step start and end as the engine's event log reported them (within ~0.1 s), per
resource type and operation; a step in flight may be waiting inside the provider.
Baseline: the script's own progress lines, mean seconds per node.

{where_time_goes(bench.results)}

## Where the CPU goes

CPU-s per cgroup: this process (the control plane, the release server, and for the
baseline the scripts, `ssh`/`scp` and `llmgw ctl`), the `pulumi` CLI (the engine), the
Python language host with the program's python (`__main__.py`: stack config, the resource
graph), the dynamic-provider plugins (the project's providers: SSH and the nodes' work),
the lab hosts; and the rest of the machine.

{cpu_breakdown(bench.results)}

## State

{state_breakdown(bench.results) or '(no successful pulumi up)'}
"""


def language_comparison(results: Sequence[Result]) -> str:
    """The language runs side by side per size: wall time, agents up and CPU of each `pulumi up`."""
    sizes = sorted({r.size for r in results if r.kind.startswith(LANGUAGE_UP)})
    if not sizes:
        return "(not measured)"
    rows = ["| N | figure | Python | TypeScript | TypeScript / Python |", "|---:|---|---:|---:|---:|"]
    for size in sizes:
        py, ts = (next((r for r in results if r.size == size and r.kind == f"{LANGUAGE_UP} {lang}"), None)
                  for lang in LANGUAGES)
        figures: list[tuple[str, Callable[[Result], float | None]]] = [
            ("`pulumi up` wall, s", lambda r: r.wall), ("agents up, s", lambda r: r.agents_up),
            ("CPU-s operator's side (engine + program + provider)", operator_cpu), ("CPU-s machine", lambda r: r.cpu.machine)]
        for label, get in figures:
            a, b = (None if r is None or not r.ok else get(r) for r in (py, ts))
            ratio = f"{b / a:.2f}" if a and b is not None else "-"
            rows.append(f"| {size} | {label} | {'-' if a is None else f'{a:.1f}'} | {'-' if b is None else f'{b:.1f}'} "
                        f"| {ratio} |")
    return "\n".join(rows)


def signer_comparison(results: Sequence[Result]) -> str:
    """The signer runs side by side per size: wall time and CPU of each `pulumi up`, the HSM's over pkiDir's, and
    seconds per certificate (the ClientCertificate steps of the up, and the signing step alone)."""
    sizes = sorted({r.size for r in results if r.kind.startswith(SIGNED_UP)})
    if not sizes:
        return "(not measured)"
    rows = ["| N | figure | pkiDir | HSM signer | HSM / pkiDir |", "|---:|---|---:|---:|---:|"]
    for size in sizes:
        base, hsm = (next((r for r in results if r.size == size and r.kind == f"{SIGNED_UP} {name}"), None)
                     for name in SIGNERS)

        def step(r: Result | None, what: str) -> float | None:
            st = None if r is None else r.detail.get("steps", {}).get("ClientCertificate create")
            if st is None:
                return None
            return float(st["mean_s"] if what == "mean" else (st["last_end_s"] - st["first_start_s"]) / st["count"])

        figures: list[tuple[str, Callable[[Result | None], float | None], int]] = [
            ("`pulumi up` wall, s", lambda r: None if r is None else r.wall, 2),
            ("agents up, s", lambda r: None if r is None else r.agents_up, 1),
            ("CPU-s ours + hosts", lambda r: None if r is None else r.cpu_own, 1),
            ("CPU-s operator's side (engine + program + provider)", lambda r: None if r is None else operator_cpu(r), 1),
            ("CPU-s machine", lambda r: None if r is None else r.cpu.machine, 1),
            ("ClientCertificate step, mean s (SSH, key pair on the node, signing, check)", lambda r: step(r, "mean"), 3),
            ("ClientCertificate steps, first start to last end / N, s per certificate", lambda r: step(r, "span"), 3),
            (f"signing step alone, s per certificate ({size} one after another, with the check)",
             lambda r: None if r is None else r.detail.get("signing_alone_s"), 4),
        ]
        for label, value, digits in figures:
            a, b = value(base), value(hsm)
            rows.append(f"| {size} | {label} | {fmt(a, digits)} | {fmt(b, digits)} | {fmt(ratio(b, a))} |")
        failed = [r.scenario for r in (base, hsm) if r is not None and not r.ok]
        if failed:
            rows.append(f"| {size} | FAILED | {'; '.join(failed)} | | |")
    return "\n".join(rows)


def engine_env_text(env: dict[str, str]) -> str:
    return (" Every engine run had " + ", ".join(f"`{k}={v}`" for k, v in sorted(env.items()))
            + " in its environment (--engine-env).") if env else ""


def list_text(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values) or "none"


def sizes_arg(text: str) -> list[int]:
    """'1,10,30' -> [1, 10, 30]; '' -> [] (that part skipped)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,10,30") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be at least 1")
    return values


def estimate_minutes(sizes: Sequence[int], latency: Sequence[int], scale: Sequence[int], shard_counts: Sequence[int],
                     shard_sizes: Sequence[int], signer_sizes: Sequence[int] = ()) -> float:
    """A rough duration on this 2-CPU machine, from earlier runs (the hosts' CPU dominates)."""
    return (1.0 + sum(0.6 + 0.15 * n for n in sizes) + sum(0.5 + 0.2 * n for n in latency)
            + sum(1.0 + 0.03 * n for n in scale) + len(shard_counts) * sum(0.3 + 0.02 * n for n in shard_sizes)
            + sum(1.0 + 0.06 * n for n in signer_sizes))


def mem_available_mib() -> float:
    return next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemAvailable:")) / 1024


def full_run_minutes() -> float:
    """The estimated duration of the default (full) run."""
    return estimate_minutes([1, 10, 30], [1, 10, 30], [SCALE_N, 200], [4, 8, 16], [TARGET_N, SCALE_N], [TARGET_N])


def host_capacity(host_mib: float, running: int) -> int:
    """How many lab hosts this machine holds: 85% of the available memory (with the `running` hosts' back) and pids.

    `host_mib` is what a booted host took in this run (at least 80 MiB assumed:
    a host keeps booting after its sshd answers; ~100 MiB RSS measured per host).
    """
    per_host = max(host_mib, 80.0)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return min(int((mem_available_mib() + running * per_host) * 0.85 / per_host), pid_max // 100)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.onboard", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run (~3 min): plain 1,3, +50 ms RTT at 3, no scale or provider-count runs, "
                             "one repeat; results only printed (and kept in the work dir)")
    parser.add_argument("--sizes", type=sizes_arg, help="plain-bridge fleet sizes (default 1,10,30; --quick 1,3)")
    parser.add_argument("--latency-sizes", type=sizes_arg,
                        help=f"sizes run with +{2 * DELAY_MS} ms RTT through toxiproxy (default 1,10,30; --quick 3)")
    parser.add_argument("--scale-sizes", type=sizes_arg,
                        help="sizes of the scale runs, pulumi only (default 100,200; --quick none); "
                             "a size this machine cannot hold is skipped, saying why")
    parser.add_argument("--shards", type=sizes_arg, help="provider-process counts compared (default 4,8,16)")
    parser.add_argument("--shard-sizes", type=sizes_arg,
                        help="sizes the provider-process counts are compared at (default 30,100; --quick none)")
    parser.add_argument("--signer-sizes", type=sizes_arg,
                        help="sizes at which `pulumi up` with pkiDir and with the HSM signer are compared "
                             "(default 30; --quick none)")
    parser.add_argument("--language-sizes", type=sizes_arg,
                        help="sizes at which `pulumi up` of the Python program and of the TypeScript one "
                             "(bench/typescript-fleet) are compared (default none)")
    parser.add_argument("--reduced-ca", action="store_true",
                        help="scale runs: the hosts trust 3 system CAs (a smaller bundle for update-ca-certificates)")
    parser.add_argument("--engine-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set this in the environment of every engine run (repeatable), e.g. to try an engine setting")
    parser.add_argument("--repeats", type=int, help="runs of each short scenario, median kept (default 3; --quick 1)")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each run wait up to this long for other work on the machine to stop (default 0)")
    parser.add_argument("--out", type=Path, help=f"where to write the table and plots (default {DOC.relative_to(REPO)})")
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                        help="measure nothing: write the report (and plots) of an earlier run from its results.json")
    args = parser.parse_args(argv)
    if args.render:
        return rerender(args.render, args.out or DOC)
    if any("=" not in item for item in args.engine_env):
        parser.error("--engine-env takes NAME=VALUE")
    if os.geteuid() != 0:
        parser.error("needs root: the lab hosts are systemd-nspawn containers in network namespaces")
    pick = lambda given, quick, full: given if given is not None else (quick if args.quick else full)  # noqa: E731
    sizes = pick(args.sizes, [1, 3], [1, 10, 30])
    latency_sizes = pick(args.latency_sizes, [3], [1, 10, 30])
    scale_sizes = pick(args.scale_sizes, [], [SCALE_N, 200])
    shard_counts = pick(args.shards, [], [4, 8, 16])
    shard_sizes = pick(args.shard_sizes, [], [TARGET_N, SCALE_N]) if shard_counts else []
    signer_sizes = pick(args.signer_sizes, [], [TARGET_N])
    language_sizes = args.language_sizes or []
    repeats = args.repeats or (1 if args.quick else 3)
    out = args.out or (WORK / "benchmark-quick.md" if args.quick else DOC)
    for tool in ("ssh", "scp"):
        if shutil.which(tool) is None:
            parser.error(f"`{tool}` is missing: install the Debian package openssh-client")
    tools_dir = Path(subprocess.run([str(REPO / "scripts" / "bench-tools.sh")], check=True, capture_output=True,
                                    text=True).stdout.strip())

    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t0 = time.monotonic()
    log_dir = WORK / "logs" / time.strftime("%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(sizes=sizes, repeats=repeats, log_dir=log_dir, wait_quiet=args.wait_quiet,
                  latency_sizes=latency_sizes, scale_sizes=scale_sizes, shard_counts=shard_counts,
                  shard_sizes=shard_sizes, signer_sizes=signer_sizes, language_sizes=language_sizes,
                  reduced_ca=args.reduced_ca, tools_dir=tools_dir,
                  engine_env=dict(item.split("=", 1) for item in args.engine_env))
    command = " ".join(["sudo .venv/bin/python -m bench.onboard", *(sys.argv[1:] if argv is None else argv)])
    machine = machine_description()
    estimate = estimate_minutes(sizes, latency_sizes, scale_sizes, shard_counts, shard_sizes, signer_sizes)
    print(f"machine: {machine}\nlogs: {log_dir}\nplain {list_text(sizes)}; +{2 * DELAY_MS} ms RTT "
          f"{list_text(latency_sizes)}; scale {list_text(scale_sizes)}; providers {list_text(shard_counts)} at "
          f"{list_text(shard_sizes)}; estimated duration ~{estimate:.0f} min", flush=True)
    fingerprint = "?"
    skipped: list[str] = []

    def record() -> dict[str, Any]:
        """Everything measured so far, as results.json holds it (written after every part, read by --render)."""
        return {"plan": {"sizes": sizes, "latency_sizes": latency_sizes, "scale_sizes": scale_sizes,
                         "shard_counts": shard_counts, "shard_sizes": shard_sizes, "signer_sizes": signer_sizes,
                         "reduced_ca": args.reduced_ca,
                         "repeats": repeats, "imports": bench.imports, "engine_env": bench.engine_env},
                "machine": machine, "fingerprint": fingerprint, "started": started, "seconds": time.monotonic() - t0,
                "command": command, "skipped": skipped, "estimate": estimate,
                "results": [dataclasses.asdict(r) for r in bench.results]}

    def part(run: Callable[[int], None], size: int) -> None:
        run(size)
        (log_dir / "results.json").write_text(json.dumps(record(), indent=1))

    # A `timeout` or `kill` ends the run like Ctrl-C: the lab is torn down and what was measured is reported.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with own_cgroup():
        try:
            bench.setup()
            fingerprint = bench.package_fingerprint()
            bench.say(f"set up; package: {fingerprint}")
            bench.say(f"import check: {bench.imports}")
            for size in sizes:
                part(bench.run_size, size)
            for size in latency_sizes:
                part(bench.run_latency, size)
            for size in scale_sizes + shard_sizes:
                capacity = host_capacity(bench.host_mib, sum(1 for h in bench.lab.hosts.values() if h.running))
                if size > capacity:
                    skipped.append(f"runs at {size} nodes skipped: this machine holds about {capacity} lab hosts "
                                   f"({max(bench.host_mib, 80):.0f} MiB each)")
                    print(skipped[-1], flush=True)
                elif size in scale_sizes:
                    part(bench.run_scale, size)
            for size in shard_sizes:
                if not any(f"at {size} nodes skipped" in s for s in skipped):
                    part(bench.run_shards, size)
            for size in signer_sizes:
                part(bench.run_signers, size)
            for size in language_sizes:
                part(bench.run_languages, size)
        except KeyboardInterrupt:
            skipped.append(f"interrupted after {(time.monotonic() - t0) / 60:.1f} min: the report has what was measured")
            print(skipped[-1], flush=True)
        finally:
            if bench.toxiproxy is not None:
                bench.toxiproxy.stop()
            bench.teardown()
    final = record()
    (log_dir / "results.json").write_text(json.dumps(final, indent=1))
    return report(bench, final, out)


def report(bench: Bench, record: dict[str, Any], out: Path) -> int:
    """Plots and docs beside `out`, the report printed, then the one-screen summary."""
    out.parent.mkdir(parents=True, exist_ok=True)
    plots = draw_plots(growth_figures(bench.results), out.parent)
    doc = render(bench, record["machine"], record["fingerprint"], record["started"], record["seconds"],
                 record["command"], plots)
    out.write_text(doc)
    print("\n" + doc)
    _, shard_notes = shard_comparison(bench.results)
    notes = [*shard_notes, *superlinear_notes(growth_figures(bench.results)), *record["skipped"],
             f"written to {out} with {len(plots)} plot(s) beside it; benchmark time {record['seconds'] / 60:.1f} min "
             f"(estimated {record['estimate']:.0f})"]
    print("\n" + summary(issue12_targets(bench.results), notes))
    if bench.signer_sizes:
        print("\npkiDir beside the HSM signer (--signer-sizes):\n" + signer_comparison(bench.results))
    if any(r.kind.startswith(LANGUAGE_UP) for r in bench.results):
        print("\nPython beside TypeScript (--language-sizes):\n" + language_comparison(bench.results))
    return 0 if all(r.ok for r in bench.results) else 1


def rerender(path: Path, out: Path) -> int:
    """The report of an earlier run again, from its results.json (e.g. after a change of the report's code)."""
    record = json.loads(path.read_text())
    results = []
    for raw in record["results"]:
        raw = dict(raw)
        raw.setdefault("reduced_ca", "(--reduced-ca)" in raw.get("note", ""))  # results.json before the field
        raw["cpu"] = Counters(**raw["cpu"])
        if raw.get("state"):
            state = dict(raw["state"])
            state["biggest_keys_no_pem"] = [tuple(kv) for kv in state["biggest_keys_no_pem"]]
            raw["state"] = StateSize(**state)
        results.append(Result(**raw))
    plan = record["plan"]
    bench = Bench(sizes=plan["sizes"], repeats=plan["repeats"], log_dir=path.parent, results=results,
                  latency_sizes=plan["latency_sizes"], scale_sizes=plan["scale_sizes"],
                  shard_counts=plan["shard_counts"], shard_sizes=plan["shard_sizes"],
                  signer_sizes=plan.get("signer_sizes", []), reduced_ca=plan["reduced_ca"],
                  imports=plan["imports"], engine_env=plan.get("engine_env", {}))
    return report(bench, record, out)


if __name__ == "__main__":
    sys.exit(main())
