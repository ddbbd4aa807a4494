"""The benchmark's scenarios: the seed script's baseline, the pulumi runs, the floor, and what each size runs
(docs/benchmark-method.md, "Scenarios")."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import yaml

from bench import daily
from bench.config import (
    CACHE,
    DELAY_MS,
    FLOOR,
    LANGUAGE_UP,
    LANGUAGES,
    RELEASE,
    REPO,
    RESUMED,
    RESUMES,
    SCRIPT_PHASES,
    SEED_SCRIPT,
    SIGNED_UP,
    SSH_USER,
    SSH_WAIT,
    WORK,
)
from bench.harness import Harness
from bench.measure import Counters, Result, parallel, state_size
from bench.toxiproxy import LOOPBACK
from lab import seed

if TYPE_CHECKING:
    from lab.stack import LabStack


@dataclass
class Bench(Harness):
    """The harness with the scenarios it measures; main() runs them per size."""

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


    def pulumi_runs(self, size: int, hosts: Sequence[Any], then: Sequence[str] = ("noop", "preview", "refresh", "empty"),
                    resumes: int = 0) -> LabStack | None:
        """`pulumi up` from scratch, then on the onboarded fleet the runs named in `then`, in that order.

        Returns the onboarded stack (None when its `up` failed), for more runs on it (bench/daily.py).
        """
        tag = f"n{size}" + (f"d{self.delay_ms}" if self.delay_ms else "") + (f"s{self.shards}" if self.shards else "") + self.stack_tag
        from llmgw_pulumi.stack.shards import SHARDS_ENV

        stack = self.new_stack(f"bench-{tag}", extra_env={SHARDS_ENV: str(self.shards)} if self.shards else None)
        stack.set_config(self.stack_config([(h.hostname, h.addr) for h in hosts]))
        up = self.measure(size, "pulumi up, from scratch", hosts,
                          lambda: self.engine_run(stack, "up", f"{tag}-up"), agents=True)
        # A failed `up` tells the operator to run it again (onboarding resumes where each node is), as a CI job's
        # retries would: at most `resumes` times, each its own row. Agents that connected in the failed run do not
        # connect again, so a resumed run does not wait for them; the no-op after it checks that nothing is left.
        for attempt in range(resumes):
            if up.ok:
                break
            up = self.measure(size, RESUMED, hosts, lambda a=attempt: self.engine_run(stack, "up", f"{tag}-resume{a}"))
        if not up.ok:
            return None
        # As `pulumi stack export` prints it: secrets stay encrypted, as in the stored state.
        self.weigh_hosts(hosts, "onboarded")
        exported = stack.export_raw()
        up.state, up.state_bytes = state_size(json.loads(exported)["deployment"], size), len(exported)
        if "noop" in then:
            noop = self.repeated(size, "pulumi up, no-op", hosts, lambda i: self.engine_run(stack, "up", f"{tag}-noop-{i}"))
            self.record_state(noop, [stack])
        for verb, scenario in (("preview", "pulumi preview"), ("refresh", "pulumi refresh")):
            if verb in then:
                r = self.measure(size, scenario, hosts, partial(self.engine_run, stack, verb, f"{tag}-{verb}"))
                self.record_state(r, [stack])
        if "empty" not in then:
            return stack
        empty = self.new_stack(f"empty-{tag}", project=self.empty_project())
        first = empty.up()  # creates the stack resource; the measured ups after it change nothing, like a no-op up
        if not first.ok:
            print(f"  empty stack: first up FAILED: {first.output[-300:]}")
            return stack
        self.repeated(size, "pulumi up, empty stack", hosts, lambda i: self.engine_run(empty, "up", f"{tag}-empty-{i}"))
        return stack


    def empty_project(self) -> Path:
        """The repository's Pulumi.yaml beside a __main__.py that registers nothing: the engine's own floor."""
        project = WORK / "empty-project"
        shutil.rmtree(project, ignore_errors=True)
        project.mkdir(parents=True)
        shutil.copy2(REPO / "Pulumi.yaml", project / "Pulumi.yaml")
        (project / "__main__.py").write_text(
            '"""Registers nothing (bench/onboard.py): `pulumi up` of it is what the engine costs on its own."""\n')
        return project

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
        """Plain bridge, no baseline: `pulumi up` from scratch, no-op up, preview, refresh; with --daily the daily
        changes on the same stack, with --stacks the same nodes as that many stacks at once (bench/daily.py)."""
        print(f"\n== N = {size}, scale" + (", hosts trusting 3 system CAs" if self.reduced_ca else ""), flush=True)
        extra = daily.changed_count(size) if self.daily else 0
        hosts = self.fresh_hosts(size + extra, reduced_ca=self.reduced_ca)
        first = len(self.results)
        # The targets' runs first (no-op, preview, the daily changes), the refresh last: a run stopped early at a
        # large size (a timeout, Ctrl-C) keeps what the targets need.
        stack = self.pulumi_runs(size, hosts[:size], then=("noop", "preview"), resumes=RESUMES)
        if stack is not None and extra:
            print(f"\n== N = {size}, daily changes", flush=True)
            daily.changes(self, size, stack, hosts[:size], hosts[size:])
        if stack is not None:
            # After the daily changes the fleet is the original one, 10 added and 10 removed: the same size.
            self.record_state(self.measure(size, "pulumi refresh", hosts,
                                           partial(self.engine_run, stack, "refresh", f"n{size}-refresh")), [stack])
        if size in self.stack_sizes:
            self.run_stacks(size, first=first)
        else:
            self.mark_reduced_ca(first)

    def run_stacks(self, size: int, first: int | None = None) -> None:
        """The same N nodes as each of --stacks' counts of stacks at once (bench/daily.py), on fresh hosts."""
        first = len(self.results) if first is None else first
        for count in self.stack_counts:
            print(f"\n== N = {size}, {count} stack(s) at once", flush=True)
            daily.at_once(self, size, count)
        self.mark_reduced_ca(first)

    def run_rack(self, size: int, count: int) -> None:
        """One rack's stack of a `size`-node fleet split into `count` stacks, measured alone (bench/daily.py)."""
        print(f"\n== N = {size} as {count} stacks: one rack's stack alone", flush=True)
        first = len(self.results)
        daily.one_rack(self, size, count)
        self.mark_reduced_ca(first)

    def mark_reduced_ca(self, first: int) -> None:
        """Say on the results from `first` on that their hosts trusted 3 system CAs, when they did."""
        if self.reduced_ca:
            for r in self.results[first:]:
                r.reduced_ca = True
                r.note = (r.note + " hosts trust 3 system CAs (--reduced-ca)").strip()

    def run_shards(self, size: int) -> None:
        """`pulumi up` from scratch with each provider-process count."""
        for k in self.shard_counts:
            print(f"\n== N = {size}, {k} provider processes", flush=True)
            hosts = self.fresh_hosts(size, reduced_ca=self.reduced_ca)
            first = len(self.results)
            self.shards = k
            try:
                self.pulumi_runs(size, hosts, then=())
            finally:
                self.shards = None
            self.mark_reduced_ca(first)

    def run_checkpoints(self, size: int) -> None:
        """`pulumi up` from scratch and a no-op `up`, first as the engine runs them (the state written after every
        step), then on fresh hosts with the engine writing it once, at the end (SKIP_CHECKPOINTS_ENV)."""
        for skip in (False, True):
            print(f"\n== N = {size}, " + ("checkpoints skipped" if skip else "checkpoints written"), flush=True)
            hosts = self.fresh_hosts(size, reduced_ca=self.reduced_ca)
            first = len(self.results)
            self.skip_checkpoints, self.stack_tag = skip, "-nockpt" if skip else "-ckpt"
            try:
                self.pulumi_runs(size, hosts, then=("noop",))
            finally:
                self.skip_checkpoints, self.stack_tag = False, ""
            self.mark_reduced_ca(first)

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
        from lab.languages import VIRTUALENV, added_packages

        adds = added_packages()
        for lang in LANGUAGES:
            print(f"\n== N = {size}, pulumi up from scratch, program in {lang}", flush=True)
            hosts = self.fresh_hosts(size)
            if lang == "Python":
                stack = self.new_stack(f"lang-python-n{size}")
            else:
                stack = self.new_stack(f"lang-typescript-n{size}", project=TYPESCRIPT_FLEET, extra_env={
                    "PULUMI_RUNTIME_VIRTUALENV": VIRTUALENV, "npm_config_cache": str(CACHE / "npm"),
                    "npm_config_prefer_offline": "true"})
                typescript_fleet(stack.work_dir, adds)
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


TYPESCRIPT_FLEET = REPO / "bench" / "typescript-fleet"


def typescript_fleet(work_dir: Path, adds: dict[str, Path]) -> None:
    """bench/typescript-fleet in ``work_dir``, set up as the README says: the TypeScript example's project as
    `pulumi package add <this repository>` leaves it (the SDK, the npm packages, Pulumi.yaml's ``packages``), with
    the fleet's program and project name in place of the example's."""
    from lab.languages import package_add

    package_add(SimpleNamespace(work_dir=work_dir), "typescript", adds)
    added = yaml.safe_load((work_dir / "Pulumi.yaml").read_text())
    project = {**yaml.safe_load((TYPESCRIPT_FLEET / "Pulumi.yaml").read_text()), "packages": added["packages"]}
    (work_dir / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    for name in ("index.ts", "tsconfig.json"):
        shutil.copy2(TYPESCRIPT_FLEET / name, work_dir / name)
