"""Issues 6, 12 and 21's benchmark: onboarding N real-systemd lab hosts with the original script and with `pulumi up`.

    sudo .venv/bin/python -m bench.onboard            # the full run (see --help for the sizes; ~40 min)
    sudo .venv/bin/python -m bench.onboard --quick    # a smoke run, about 3 min

Measurement only, never part of the pass/fail tests. What each run does, what is
measured and why it is built this way: docs/benchmark-method.md. The modules:
config (settings and run names), measure (counters, engine steps, state size),
engine (the CPU-counting engine wrappers), harness (lab, cluster, one measured
run), scenarios (baseline, pulumi runs, floor, per size), report, targets and
page (the tables, targets, plots and docs/benchmark.md). This module parses the
command line and runs the parts in order.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

# The `name as name` imports re-export what tests/unit/test_bench.py imports from here (from before the split).
from bench import engine
from bench import light as light_bench
from bench.backend import LAB_POSTGRES, Backend, lab_postgres_rtt
from bench.config import DELAY_MS, DOC, REPO, SCALE_N, TARGET_N, WORK
from bench.config import FLOOR as FLOOR
from bench.config import PAR as PAR
from bench.config import SEQ as SEQ
from bench.config import SIGNED_UP as SIGNED_UP
from bench.config import UP as UP
from bench.measure import ASSUMED_HOST_MIB, ASSUMED_LIGHT_HOST_MIB, host_capacity, machine_description, own_cgroup
from bench.measure import Counters as Counters
from bench.measure import Result as Result
from bench.page import estimate_minutes, list_text, report, rerender
from bench.scenarios import Bench
from bench.scenarios import proxy_host_blocks as proxy_host_blocks
from bench.targets import issue12_targets as issue12_targets
from bench.targets import signer_comparison as signer_comparison
from lab.linux import LabError


def backend_arg(text: str) -> Backend:
    """--backend: a file:// or postgres:// URL, or lab-postgres[:RTT_MS] (bench/backend.py)."""
    if text.startswith(LAB_POSTGRES):
        try:
            lab_postgres_rtt(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    elif not text.startswith(("file:///", "postgres://", "postgresql://")):
        raise argparse.ArgumentTypeError(f"{text!r}: give file:///a/dir, postgres://user@host:port/db (the password "
                                         "in PGPASSWORD) or lab-postgres[:RTT_MS]")
    return Backend(text)


def sizes_arg(text: str) -> list[int]:
    """'1,10,30' -> [1, 10, 30]; '' -> [] (that part skipped)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,10,30") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be at least 1")
    return values


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
    parser.add_argument("--checkpoint-sizes", type=sizes_arg, default=[],
                        help="sizes at which `pulumi up` from scratch and a no-op `up` run as the engine runs them, "
                             "then on fresh hosts with PULUMI_SKIP_CHECKPOINTS=true (the state written once, at the "
                             "end), side by side (default none)")
    parser.add_argument("--signer-sizes", type=sizes_arg,
                        help="sizes at which `pulumi up` with pkiDir and with the HSM signer are compared "
                             "(default 30; --quick none)")
    parser.add_argument("--language-sizes", type=sizes_arg,
                        help="sizes at which `pulumi up` of the Python program and of the TypeScript one "
                             "(bench/typescript-fleet) are compared (default none)")
    parser.add_argument("--daily", action="store_true",
                        help="scale runs: then the daily changes on the same stack: 1%% of the agents upgraded with "
                             "llmgw:rollout, 10 nodes added, 10 removed (bench/daily.py)")
    parser.add_argument("--stacks", type=sizes_arg, default=[], metavar="K,...",
                        help="scale runs: the same nodes also as K stacks at once against the one backend, e.g. 1,4,8")
    parser.add_argument("--stack-sizes", type=sizes_arg, metavar="N,...",
                        help="the sizes at which --stacks runs (default: every scale size); a size not among the "
                             "scale sizes runs only that part, on fresh hosts")
    parser.add_argument("--backend", type=backend_arg, metavar="URL",
                        help=f"the state backend of every stack: file://DIR, postgres://USER@HOST:PORT/DB (the "
                             f"password in PGPASSWORD), or lab-postgres[:RTT_MS] to start lab/postgres.py's server, "
                             f"behind toxiproxy with RTT_MS added (default file://{WORK / 'state'}, emptied first)")
    parser.add_argument("--reduced-ca", action="store_true",
                        help="scale runs: the hosts trust 3 system CAs (a smaller bundle for update-ca-certificates)")
    parser.add_argument("--light-hosts", action="store_true",
                        help="every part on light lab hosts (lab/light.py: KSM, no ASLR, no D-Bus/logind in each "
                             "host), so the machine holds more of them; the report says so")
    parser.add_argument("--memory-sizes", type=sizes_arg, default=[],
                        help="sizes at which an onboarded host's memory is measured with default and with light hosts "
                             "side by side, with ksmd's CPU and what host_capacity then says for 1,000 (default none)")
    parser.add_argument("--engine-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set this in the environment of every engine run (repeatable), e.g. to try an engine setting")
    parser.add_argument("--rack-of", type=int, nargs=2, metavar=("FLEET", "STACKS"),
                        help="measure one rack's stack alone: FLEET/STACKS nodes onboarded, then its no-op up, preview "
                             "and the daily changes (1%% of FLEET upgraded, in this rack), recorded as one stack of "
                             "STACKS holding FLEET nodes (the other stacks' state is separate, and no run of this one "
                             "reads it), e.g. --rack-of 1000 8")
    parser.add_argument("--grpc-log", action="store_true",
                        help="stacks at once: each stack's `up` (and the one after a failed one) logs every gRPC call of "
                             "its engine (PULUMI_DEBUG_GRPC) to <logs>/<run>.grpc.jsonl, to find which call a reset "
                             "broke; those rows say so (their engine CPU includes the logging)")
    parser.add_argument("--repeats", type=int, help="runs of each short scenario, median kept (default 3; --quick 1)")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each run wait up to this long for other work on the machine to stop (default 0)")
    parser.add_argument("--out", type=Path, help=f"where to write the table and plots (default {DOC.relative_to(REPO)})")
    parser.add_argument("--render", type=Path, nargs="+", metavar="RESULTS_JSON",
                        help="measure nothing: write the report (and plots) of earlier runs from their results.json "
                             "(several: one page, e.g. the file backend's run and PostgreSQL's)")
    args = parser.parse_args(argv)
    if args.render:
        return rerender(args.render, args.out or DOC)
    if args.rack_of and not (1 <= args.rack_of[1] <= args.rack_of[0]):
        parser.error(f"--rack-of {args.rack_of[0]} {args.rack_of[1]}: give a fleet of at least as many nodes as "
                     "stacks, e.g. --rack-of 1000 8")
    if args.rack_of and not args.daily:
        parser.error("--rack-of measures the daily changes: give --daily too")
    if any("=" not in item for item in args.engine_env):
        parser.error("--engine-env takes NAME=VALUE")
    if args.stack_sizes and not args.stacks:
        parser.error("--stack-sizes needs --stacks: give the stack counts to run at those sizes, e.g. --stacks 4,8")
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
    stack_sizes = args.stack_sizes if args.stack_sizes is not None else list(scale_sizes)
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
                  checkpoint_sizes=args.checkpoint_sizes, reduced_ca=args.reduced_ca, tools_dir=tools_dir,
                  engine_env=dict(item.split("=", 1) for item in args.engine_env), daily=args.daily,
                  stack_counts=args.stacks, stack_sizes=stack_sizes, light_hosts=args.light_hosts,
                  memory_sizes=args.memory_sizes, grpc_log=args.grpc_log)
    if args.backend is not None:
        bench.backend = args.backend
    command = " ".join(["sudo .venv/bin/python -m bench.onboard", *(sys.argv[1:] if argv is None else argv)])
    machine = machine_description()
    estimate = estimate_minutes(sizes, latency_sizes, scale_sizes, shard_counts, shard_sizes, signer_sizes,
                                daily=args.daily, stack_counts=args.stacks, stack_sizes=stack_sizes)
    print(f"machine: {machine}\nlogs: {log_dir}\nplain {list_text(sizes)}; +{2 * DELAY_MS} ms RTT "
          f"{list_text(latency_sizes)}; scale {list_text(scale_sizes)}; providers {list_text(shard_counts)} at "
          f"{list_text(shard_sizes)}; daily changes {'yes' if args.daily else 'no'}; stacks at once "
          f"{list_text(args.stacks)} at {list_text(stack_sizes if args.stacks else [])}; backend "
          f"{bench.backend.shown}; estimated duration ~{estimate:.0f} min", flush=True)
    fingerprint = "?"
    skipped: list[str] = []

    def record() -> dict[str, Any]:
        """Everything measured so far, as results.json holds it (written after every part, read by --render)."""
        return {"plan": {"sizes": sizes, "latency_sizes": latency_sizes, "scale_sizes": scale_sizes,
                         "shard_counts": shard_counts, "shard_sizes": shard_sizes, "signer_sizes": signer_sizes,
                         "checkpoint_sizes": args.checkpoint_sizes,
                         "reduced_ca": args.reduced_ca, "light_hosts": args.light_hosts,
                         "memory_sizes": args.memory_sizes, "memory_rows": bench.memory_rows,
                         "daily": args.daily, "stack_counts": args.stacks, "stack_sizes": stack_sizes,
                         "backend": bench.backend.shown, "backend_note": bench.backend.note,
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
            fingerprint = engine.package_fingerprint(bench.snapshot)
            bench.say(f"set up; package: {fingerprint}")
            bench.say(f"import check: {bench.imports}")
            for size in args.memory_sizes:
                part(partial(light_bench.run_memory, bench), size)
            for size in sizes:
                part(bench.run_size, size)
            for size in latency_sizes:
                part(bench.run_latency, size)
            stacks_only = [n for n in stack_sizes if n not in scale_sizes] if args.stacks else []
            for size in dict.fromkeys(scale_sizes + stacks_only + shard_sizes):  # each size once: a shard size may be a scale size
                running = sum(1 for h in bench.lab.hosts.values() if h.running)
                per_host = bench.host_mib or (ASSUMED_LIGHT_HOST_MIB if args.light_hosts else ASSUMED_HOST_MIB)
                capacity = host_capacity(per_host, running, bench.host_tasks)
                if size > capacity:
                    skipped.append(f"runs at {size} nodes skipped: this machine holds about {capacity} lab hosts "
                                   f"({per_host:.0f} MiB each)")
                    print(skipped[-1], flush=True)
                elif size in scale_sizes:
                    part(bench.run_scale, size)
                elif size in stacks_only:
                    part(bench.run_stacks, size)
            for size in shard_sizes:
                if not any(f"at {size} nodes skipped" in s for s in skipped):
                    part(bench.run_shards, size)
            for size in args.checkpoint_sizes:
                part(bench.run_checkpoints, size)
            if args.rack_of:
                part(partial(bench.run_rack, count=args.rack_of[1]), args.rack_of[0])
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
            try:
                bench.teardown()
            except LabError as exc:  # what was measured is reported all the same; the next setup sweeps the lab
                skipped.append(f"the lab's teardown failed ({exc}); the next run's setup removes what is left")
                print(skipped[-1], flush=True)
    final = record()
    (log_dir / "results.json").write_text(json.dumps(final, indent=1))
    return report(bench, final, out)


if __name__ == "__main__":
    sys.exit(main())
