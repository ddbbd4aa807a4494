"""The benchmark's harness: the lab, the cluster around it (CA, control plane, release server), the engine with
its CPU-counting wrappers, fresh hosts, and one measured run (docs/benchmark-method.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import daily, engine
from bench import light as light_bench
from bench.backend import LAB_POSTGRES, Backend, start_lab_postgres
from bench.config import (
    AGENT_TIMEOUT,
    BOOT_TIMEOUT,
    CACHE,
    CHECKPOINTS_SKIPPED,
    LAB_NAME,
    LAB_SUBNET,
    RELEASE,
    RELEASE_PORT,
    REPO,
    SKIP_CHECKPOINTS_ENV,
    SSH_USER,
    SSH_WAIT,
    UPGRADE_RELEASE,
    WORK,
)
from bench.measure import (
    KERNEL_MIB_PER_HOST,
    Counters,
    EngineSteps,
    Result,
    host_memory,
    mem_available_mib,
    parallel,
    transport_idle_seconds,
)
from bench.report import one_line
from bench.toxiproxy import LOOPBACK
from lab import seed
from lab.host import trust_first_system_cas

if TYPE_CHECKING:
    from lab.stack import LabStack


REDUCED_CAS = 3
"""The system CAs each host trusts with --reduced-ca (lab.host.trust_first_system_cas)."""


@dataclass
class Harness:
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
    """Sizes at which `pulumi up` with the pkiDir default and with the HSM signer are compared (run_signers)."""
    language_sizes: list[int] = field(default_factory=list)
    """Sizes at which `pulumi up` of the Python program and of bench/typescript-fleet are compared (run_languages)."""
    reduced_ca: bool = False
    """Scale runs: hosts trust 3 system CAs (update-ca-certificates then has less to do)."""
    delay_ms: int = 0
    """Round-trip delay of the runs now measured; set with route_through_proxies."""
    shards: int | None = None
    """Provider processes the runs now measured force (LLMGW_PROVIDER_SHARDS); None: the package's default."""
    checkpoint_sizes: list[int] = field(default_factory=list)
    """Sizes at which `pulumi up` runs with the engine's checkpoints and without them, side by side (run_checkpoints)."""
    skip_checkpoints: bool = False
    """The runs now measured have the engine write the state once, at the end (SKIP_CHECKPOINTS_ENV)."""
    toxiproxy: Any = None
    tools_dir: Path = Path()
    """Where scripts/bench-tools.sh put toxiproxy-server."""
    engine_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every engine run (--engine-env), e.g. to try an engine setting."""
    host_mib: float = 0.0
    """The most memory a lab host took so far: its processes' PSS and the kernel's part (0 until measured)."""
    host_tasks: int = 0
    """The most threads a lab host ran so far."""
    light_hosts: bool = False
    """Every part runs on light hosts (--light-hosts; lab/light.py); host_mib and host_tasks weigh only that form."""
    memory_sizes: list[int] = field(default_factory=list)
    """Sizes at which an onboarded host's memory is measured in both forms side by side (--memory-sizes; bench/light.py)."""
    memory_rows: list[dict[str, Any]] = field(default_factory=list)
    """What bench/light.py measured, one row per size and form."""
    weights: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    """The last weigh_hosts figures by state ("booted", "onboarded"): (mean, most) MiB per host and most threads."""
    stack_tag: str = ""
    """Appended to the stack names of pulumi_runs, so a part's stacks do not meet another part's of the same size."""
    routes: dict[str, int] = field(default_factory=dict)
    """Host address -> loopback port of its proxy, while the runs go through the proxies."""
    wait_quiet: float = 0.0
    """Seconds to wait at most, before each run, for other work on the machine to stop."""
    imports: str = ""
    """What check_imports found: which copy of the package the engine's pythons import, and the CPU split."""
    started: float = field(default_factory=time.monotonic)
    backend: Backend = field(default_factory=lambda: Backend(f"file://{WORK / 'state'}"))
    """Where every stack keeps its state (--backend; bench/backend.py)."""
    postgres: Any = None
    """The lab's PostgreSQL server, when --backend lab-postgres started one."""
    daily: bool = False
    """Scale runs: the daily changes follow, on the same stack (bench/daily.py)."""
    grpc_log: bool = False
    """The stacks-at-once `up`s log every engine gRPC call (PULUMI_DEBUG_GRPC), one file per stack (--grpc-log)."""
    stack_counts: list[int] = field(default_factory=list)
    """Scale runs: the same nodes as this many stacks at once against the one backend (bench/daily.py)."""
    stack_sizes: list[int] = field(default_factory=list)
    """The sizes at which the stack counts run (--stack-sizes; the scale sizes by default)."""

    # ----------------------------------------------------------------- paths

    @property
    def hosts_needed(self) -> int:
        """The most hosts one part boots at once: its size, and the scale runs' idle hosts for the daily changes."""
        scale = max([*self.scale_sizes, *(self.stack_sizes if self.stack_counts else [])], default=0)
        extra = daily.changed_count(scale) if self.daily and scale else 0
        return max([*self.sizes, *self.latency_sizes, *self.shard_sizes, *self.checkpoint_sizes, *self.signer_sizes,
                    *self.language_sizes, scale + extra, 1])

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
    def release_signing_key_path(self) -> Path:
        """The key the lab's releases are signed with (made once): a release nothing verifies is refused."""
        return WORK / "release-signing" / "release-signing"

    @property
    def snapshot(self) -> Path:
        return WORK / "snapshot"

    # ----------------------------------------------------------------- setup

    def setup(self) -> None:
        """Lab bridge and key, CA, binaries, release server, control plane, engine; a fresh state backend."""
        from lab import pki as labpki
        from lab.control_plane import ControlPlane
        from lab.doubles.llmgw import build_llmgw
        from lab.hosts import MAX_HOSTS, Lab
        from lab.release_server import make_signing_key, publish_release
        from lab.stack import engine_bin

        WORK.mkdir(parents=True, exist_ok=True)
        for d in ("state", "projects"):  # another backend keeps its stacks: their names carry the run's id
            shutil.rmtree(WORK / d, ignore_errors=True)
        if not (self.pki_dir / "ca.pem").exists():
            labpki.init_ca(self.pki_dir)
        seed.operator_binary(self.operator_binary, RELEASE)
        releases = WORK / "releases"
        shutil.rmtree(releases, ignore_errors=True)
        if not self.release_signing_key_path.exists():
            make_signing_key(self.release_signing_key_path.parent, self.release_signing_key_path.name)
        for tag in (RELEASE, UPGRADE_RELEASE):
            publish_release(releases, tag, {"amd64": build_llmgw(tag)}, sign_with=self.release_signing_key_path)

        self.lab = Lab(name=LAB_NAME, subnet=LAB_SUBNET, workdir=CACHE / f"lab-{LAB_NAME}",
                       max_hosts=max(MAX_HOSTS, self.hosts_needed), light=self.light_hosts)
        shutil.rmtree(self.lab.hosts_dir, ignore_errors=True)
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
        if self.backend.url.startswith(LAB_POSTGRES):
            self.backend, self.postgres = start_lab_postgres(self.backend.url, self.pki_dir, self.ensure_toxiproxy)
        self.control_plane = ControlPlane(self.pki_dir, self.lab.gateway).start()
        self.engine_bin = engine_bin()
        assert self.engine_bin is not None
        engine.write_wrappers(self.engine_bin, self.engine_dir)
        engine.snapshot_package(self.snapshot)
        self.imports = engine.check_imports(self)

    @property
    def engine_dir(self) -> Path:
        """The engine as the bench runs it: the real `pulumi` binary and wrappers of it and two plugins, side by side."""
        return WORK / "engine-wrap" / "bin"

    def teardown(self) -> None:
        if self.control_plane is not None:
            self.control_plane.stop()
        if self.postgres is not None:
            self.postgres.stop()
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
        parallel([lambda h=h: wipe_and_start(h) for h in hosts], workers=10)
        self.weigh_hosts(hosts, "booted")
        if reduced_ca:
            for h in hosts:
                trust_first_system_cas(h.root, REDUCED_CAS)
        self.say(f"booted {n} fresh host(s) in {time.monotonic() - t:.1f}s"
                 + (f", each trusting {REDUCED_CAS} system CAs" if reduced_ca else ""))
        return hosts

    def weigh_hosts(self, hosts: Sequence[Any], state: str) -> None:
        """Record the memory and threads of the most demanding of `hosts` (for host_capacity, when they are of the
        form the parts run on), and say them. Light hosts are weighed once KSM has merged what it finds."""
        if not hosts:
            return
        settled = light_bench.settle_ksm(self) if self.lab.light else ""
        weights = parallel([lambda h=h: host_memory(h.cgroups[0]) for h in hosts], workers=8)
        mib = max(w[0] for w in weights) + KERNEL_MIB_PER_HOST
        tasks = max(w[1] for w in weights)
        if self.lab.light == self.light_hosts:
            self.host_mib, self.host_tasks = max(self.host_mib, mib), max(self.host_tasks, tasks)
        mean = sum(w[0] for w in weights) / len(weights) + KERNEL_MIB_PER_HOST
        self.weights[state] = (mean, mib, tasks)
        form = "light " if self.lab.light else ""
        self.say(f"memory of {len(hosts)} {state} {form}host(s): {mean:.1f} MiB each on average, {mib:.1f} at most "
                 f"(PSS{' + KSM metadata' if self.lab.light else ''} + {KERNEL_MIB_PER_HOST} kernel), {tasks} threads "
                 f"at most; {mem_available_mib() / 1024:.1f} GiB available{settled}")

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
                agents: bool = False, quiet_first: bool = True, agent_hosts: Sequence[Any] | None = None) -> Result:
        """Run `action` between two counter snapshots; onboarding runs last until every agent is connected.

        `agent_hosts`: whose agents must reconnect (all `hosts` by default). For an engine run, the bytes it wrote
        to the state backend are recorded too (bench/backend.py).
        """
        idle, idle_own = self.quiesce() if quiet_first else (0.0, 0.0)
        opens0 = self.ssh_opens(hosts)
        backend_at = self.backend.position()
        since = time.time()
        c0 = Counters.now()
        with self.backend.watch() as watched:
            ok, detail = action()
        wall = time.monotonic() - c0.wall
        agents_up = None
        if agents and ok:
            at = self.wait_agents([h.hostname for h in (hosts if agent_hosts is None else agent_hosts)], since)
            agents_up = None if at is None else at - since
            if at is None:
                detail["note"] = (detail.get("note", "") + " agents not all connected").strip()
        cpu = Counters.now() - c0
        if cpu.ksmd >= 0.05:  # light hosts: the kernel's merging thread, in the machine's CPU but not in ours + hosts
            detail["note"] = (detail.get("note", "") + f" ksmd {cpu.ksmd:.1f} CPU-s").strip()
        ssh = self.ssh_opens(hosts) - opens0
        skipped = CHECKPOINTS_SKIPPED if self.skip_checkpoints else ""
        kind = scenario.rsplit(" #", 1)[0] + skipped
        label = scenario + (f", {self.shards} providers" if self.shards else "") + skipped
        label += f" (+{self.delay_ms} ms RTT)" if self.delay_ms else ""
        result = Result(size, label, ok, wall, ssh, cpu, idle, idle_own, agents_up=agents_up,
                        remote_ops=detail.pop("remote_ops", None), note=detail.pop("note", ""), detail=detail,
                        delay_ms=self.delay_ms, shards=self.shards, kind=kind,
                        backend=self.backend.shown)
        if detail.pop("engine_run", False):
            result.backend_bytes = self.backend.written(watched, backend_at)
        self.results.append(result)
        self.say(one_line(result))
        return result

    def say(self, text: str) -> None:
        """Progress, stamped with the minutes since the start (the whole run takes a while)."""
        print(f"  [{(time.monotonic() - self.started) / 60:5.1f} min] {text}", flush=True)


    # ----------------------------------------------------------------- pulumi

    def new_stack(self, name: str, project: Path = REPO, extra_env: dict[str, str] | None = None) -> LabStack:
        """A stack of `project` in its own work dir, run by the bench's engine with the package snapshot first."""
        from lab.stack import LabStack, engine_env

        assert self.engine_bin is not None
        env = engine_env(self.engine_bin, WORK / "pulumi-home", WORK / "state")
        env["PATH"] = f"{self.engine_dir}:{env['PATH']}"  # the wrappers before the real engine
        env["PYTHONPATH"] = str(self.snapshot)
        env["PULUMI_BACKEND_URL"] = self.backend.url
        env.update(self.engine_env)
        if self.skip_checkpoints:
            env[SKIP_CHECKPOINTS_ENV] = "true"
        env.update(extra_env or {})
        return LabStack(WORK / "projects" / name, self.backend.stack_name(name, self.log_dir.name), env, project=project)

    def stack_config(self, nodes: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """Like stacks/Pulumi.local.yaml, for (node id, address) pairs of this lab."""
        return {
            "pkiDir": str(self.pki_dir),
            "servers": [self.control_plane.address],
            "agent": {"version": RELEASE, "releaseUrl": self.release_url, "releaseCa": str(self.pki_dir / "ca.pem"),
                      "signingKey": self.release_signing_key_path.with_suffix(".pub").read_text().strip()},
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
        toxiproxy = self.ensure_toxiproxy()
        for h in hosts:
            if h.addr not in self.routes:
                self.routes[h.addr] = toxiproxy.proxy(h.hostname, h.addr)
            toxiproxy.set_latency(h.hostname, rtt_ms // 2)
        self.delay_ms = rtt_ms

    def ensure_toxiproxy(self) -> Any:
        """The benchmark's toxiproxy-server, started on first use."""
        from bench.toxiproxy import Toxiproxy

        if self.toxiproxy is None:
            self.toxiproxy = Toxiproxy(self.tools_dir / "toxiproxy-server", self.log_dir / "toxiproxy.log").start()
        return self.toxiproxy

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
            "critical_path": steps.critical_path(),
            "scripts": steps.script_seconds(),
        }
        detail["engine_run"] = True  # measure() records what it wrote to the backend
        if not run.ok:
            detail["note"] = f"FAILED (see {self.log_dir / (log_name + '.log')}): " + run.output.strip()[-300:]
        return run.ok, detail

    def record_state(self, result: Result, stacks: Sequence[LabStack]) -> None:
        """The state the run left, as `pulumi stack export` prints it (unmeasured: after the run)."""
        if result.ok:
            result.state_bytes = sum(len(stack.export_raw()) for stack in stacks)


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
