"""Lines `pulumi up` prints at fleet scale (issue 39, item 3): a first `up`, a no-op `up`, and a failed `up` (the
same stack with 2 more nodes that nothing answers at), per size, for one copy of the package.

    sudo .venv/bin/python -m bench.output_lines --sizes 30,100 [--package DIR] [--label after] [--out FILE]
    .venv/bin/python -m bench.output_lines --render FILE [--recount KEPT]   # the table; KEPT: count again

``--package`` is a checkout of another version (e.g. ``git archive <commit> | tar -x -C DIR``): its project files
(``__main__.py``) and its ``llmgw_pulumi`` (first on PYTHONPATH, for the program and the provider processes) are
what runs; the lab and the CLI harness are this checkout's. Light lab hosts (lab/light.py) in a lab of its own
(LLMGW_TEST_LAB, default ``o:10.200.0``). Measurement only: the figures go to docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))
RELEASE = "v1.4.2"
UNREACHABLE = 2
"""Nodes added for the failed `up`: prepared lab hosts that are never booted."""
FIRST_HOST = 10
"""The lab index of the first host (each size boots hosts of its own, after the last size's)."""


APPROVAL = re.compile(r"llmgw v\S+( from \S+)?: the sha256 of .* approved ")
"""The release's approval line, said by the program (before and after it named the release URL)."""
FETCH = "verifies it against the sha256 approved on this machine"
"""The end of each node's "<node>: the node fetches llmgw <v> from <url> and ..." line."""
RUNS = ("up", "no-op up", "failed up")


def counts(output: str) -> dict[str, int]:
    """Lines of one run's output: all of them, those of Python tracebacks, those after ``Diagnostics:``, and
    those that say the release's approval and a node's fetch."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Diagnostics:")), len(lines))
    frames = sum(1 for line in lines if "Traceback (most recent call last)" in line or line.strip().startswith("File \""))
    return {"lines": len(lines), "traceback_lines": frames, "diagnostics_lines": len(lines) - start,
            "approval_lines": sum(1 for line in lines if APPROVAL.search(line)),
            "fetch_lines": sum(1 for line in lines if FETCH in line)}


def output_file(work: Path, label: str, size: int, run: str) -> Path:
    """Where ``measure`` keeps one run's output."""
    return work / f"{label}-{size}-{run.replace(' ', '-')}.txt"


def recounted(rows: list[dict[str, Any]], kept: Path) -> list[dict[str, Any]]:
    """``rows`` with each run counted again from the output ``measure`` kept in ``kept`` (its seconds kept): for
    rows measured before ``counts`` counted something new."""
    return [{**row, **{run: {**row[run], **counts(output_file(kept, row["label"], row["nodes"], run).read_text())}
                       for run in RUNS}} for row in rows]


def measure(sizes: list[int], package: Path, label: str, out: Path | None) -> list[dict[str, Any]]:
    from lab import pki as labpki
    from lab.control_plane import ControlPlane
    from lab.doubles.llmgw import build_llmgw
    from lab.hosts import Lab
    from lab.release_server import make_signing_key, publish_release
    from lab.stack import LabStack, engine_bin, engine_env

    name, _, subnet = os.environ.get("LLMGW_TEST_LAB", "o:10.200.0").partition(":")
    work = Path(tempfile.mkdtemp(prefix="llmgw-output-lines-"))
    lab = Lab(name=name, subnet=subnet, workdir=CACHE / f"lab-{name}",
              max_hosts=FIRST_HOST + sum(sizes) + UNREACHABLE * len(sizes), light=True)
    shutil.rmtree(lab.hosts_dir, ignore_errors=True)
    lab.setup()
    rows: list[dict[str, Any]] = []
    try:
        signing_key, signing_public = make_signing_key(work / "release-signing")
        pki_dir = work / "pki"
        labpki.init_ca(pki_dir)
        control_plane = ControlPlane(pki_dir, lab.gateway).start()
        root = work / "releases"
        publish_release(root, RELEASE, {"amd64": build_llmgw(RELEASE)}, sign_with=signing_key)
        release_addr = f"{lab.subnet}.2"
        cert, key = labpki.issue_server_cert(pki_dir, work / "release-tls", "releases", ips=[release_addr], dns=[])
        import subprocess

        server = lab.run_in_netns([sys.executable, "-m", "lab.release_server", "--root", str(root), "--bind",
                                   release_addr, "--port", "8443", "--cert", str(cert), "--key", str(key)],
                                  netns_suffix="repo", addr_index=2, cwd=str(REPO), stdout=subprocess.PIPE)
        assert server.stdout is not None and b"listening" in server.stdout.readline()
        index = FIRST_HOST
        for size in sizes:
            hosts = [lab.prepare(i) for i in range(index, index + size + UNREACHABLE)]
            index += size + UNREACHABLE
            up_hosts, down = hosts[:size], hosts[size:]
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(lambda h: h.start(), up_hosts))
            env = engine_env(engine_bin(), work / f"home-{size}", work / f"state-{size}")
            env["SSL_CERT_FILE"] = str(pki_dir / "ca.pem")
            if package != REPO:
                env["PYTHONPATH"] = str(package)
            stack = LabStack(work / f"project-{size}", f"lines{size}", env, package)

            def config(nodes: list[Any]) -> dict[str, Any]:
                return {"pkiDir": str(pki_dir), "servers": [control_plane.address],
                        "agent": {"version": RELEASE, "releaseUrl": f"https://{release_addr}:8443",
                                  "signingKey": signing_public},
                        "ssh": {"user": "deploy", "privateKeyPath": str(lab.ssh_key_path), "wait": 5},
                        "nodes": [{"id": h.hostname, "address": h.addr} for h in nodes]}

            stack.set_config(config(up_hosts))
            row: dict[str, Any] = {"label": label, "nodes": size}
            for run, expect_ok in (("up", True), ("no-op up", True), ("failed up", False)):
                if run == "failed up":
                    stack.set_config(config([*down, *up_hosts]))
                started = time.monotonic()
                done = stack.up()
                if done.ok != expect_ok:
                    raise RuntimeError(f"{run} at {size} nodes: ok={done.ok}\n{done.output[-3000:]}")
                row[run] = {**counts(done.output), "seconds": round(time.monotonic() - started, 1)}
                output_file(work, label, size, run).write_text(done.output)
            rows.append(row)
            print(json.dumps(row), flush=True)
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(lambda h: h.stop(), up_hosts))
        server.kill()
        control_plane.stop()
    finally:
        lab.teardown()
    print(f"outputs kept in {work}", flush=True)
    if out is not None:
        out.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmark.md, "Lines printed by `up`"."""
    head = ["| package | nodes | run | lines | traceback lines | lines from `Diagnostics:` on | release approval lines "
            "| node fetch lines |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    body = [f"| {r['label']} | {r['nodes']} | {run} | {r[run]['lines']} | {r[run]['traceback_lines']} | "
            f"{r[run]['diagnostics_lines']} | {r[run].get('approval_lines', '')} | {r[run].get('fetch_lines', '')} |"
            for r in rows for run in RUNS]
    return "\n".join([*head, *body])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="30,100", help="node counts, comma-separated")
    parser.add_argument("--package", type=Path, default=REPO, help="a checkout of the version to measure")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--render", type=Path, nargs="*", help="print the table of earlier --out files, measure nothing")
    parser.add_argument("--recount", type=Path, metavar="KEPT",
                        help="with one --render file: count its runs again from the outputs kept in KEPT (the "
                             "directory a measurement printed), and write them back to the file")
    args = parser.parse_args(argv)
    if args.recount:
        if not args.render or len(args.render) != 1:
            parser.error("--recount takes one --render file")
        rows = recounted(json.loads(args.render[0].read_text()), args.recount)
        args.render[0].write_text(json.dumps(rows, indent=1) + "\n")
    if args.render:
        print(table([row for path in args.render for row in json.loads(path.read_text())]))
        return
    rows = measure([int(s) for s in args.sizes.split(",") if s], args.package.resolve(), args.label, args.out)
    print(table(rows))


if __name__ == "__main__":
    main()
