"""The main job on the embedded local default: onboard three local test hosts with `pulumi up`.

    sudo scripts/local-up            # boot, onboard, check, destroy, tear down
    sudo scripts/local-up --keep     # ... and leave the hosts and agents running until Ctrl-C

Boots the hosts of stacks/Pulumi.local.yaml (lab "l" on 10.251.0.0/24; the
third host's hostname differs from its node id), a control-plane test double
on the bridge address and a release server in its own namespace, then runs the
repository's own project (Pulumi.yaml, __main__.py, stacks/) on the `local`
stack with the `pulumi` CLI in this directory, showing the CLI's own output:
`pulumi up`, what the control plane sees, `pulumi stack output fleet`, `pulumi
preview --expect-no-changes`, a second (no-op) `pulumi up`, and `pulumi
destroy`. The lab has no GPUs and no InfiniBand: gpu-03 gets an nvidia-smi
stand-in replaying a real 8x H200 node, node2 its declared HCA under ibRoot.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lab import pki as labpki
from lab.control_plane import ControlPlane
from lab.doubles.llmgw import build_llmgw
from lab.doubles.nvidia_smi import FIXTURES, build_nvidia_smi
from lab.hosts import Host, Lab
from lab.release_server import make_signing_key, publish_release
from lab.stack import REPO, LabStack, engine_bin, engine_env

CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))


def give_hardware(host: Host, node: dict[str, Any]) -> None:
    """What the lab has none of: the HCAs a node's fabric declares, as directories under its configured ibRoot;
    and, on a node whose id says GPU, an nvidia-smi stand-in that replays a real 8x H200 node."""
    ib_root = (node.get("discovery") or {}).get("ibRoot")
    for hca in (node.get("fabric") or {}).get("hcas", []) if ib_root else []:
        (host.upper / ib_root.lstrip("/") / hca).mkdir(parents=True, exist_ok=True)
    if node["id"].startswith("gpu") and FIXTURES.is_dir():
        smi = host.upper / "usr" / "bin" / "nvidia-smi"
        smi.parent.mkdir(parents=True, exist_ok=True)
        smi.write_text(build_nvidia_smi(8))
        smi.chmod(0o755)


SIGNING_KEY_LINE = re.compile(r"^(\s*signingKey:).*$", re.MULTILINE)


def release_signing_key(work: Path) -> Path:
    """The key the local release server's releases are signed with: made once, kept in the cache. The stack file
    names its public half (``agent.signingKey``); on a machine whose key is another, its line is rewritten."""
    key = work / "release-signing" / "release-signing"
    if not key.exists():
        make_signing_key(key.parent)
    public = key.with_suffix(".pub").read_text().strip()
    stack_file = REPO / "stacks" / "Pulumi.local.yaml"
    text = stack_file.read_text()
    if f"signingKey: {public}" not in text:
        stack_file.write_text(SIGNING_KEY_LINE.sub(lambda m: f"{m[1]} {public}", text, count=1))
        print(f"stacks/Pulumi.local.yaml: agent.signingKey set to this machine's local release key ({key})")
    return key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="leave the hosts and agents running until Ctrl-C")
    args = parser.parse_args()

    config = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())["config"]
    cfg = {k.split(":", 1)[1]: v for k, v in config.items()}
    nodes = cfg["nodes"]
    subnet = nodes[0]["address"].rsplit(".", 1)[0]
    work = CACHE / "local"
    pki_dir = Path(cfg["pkiDir"])
    if not (pki_dir / "ca.pem").exists():
        labpki.init_ca(pki_dir)

    lab = Lab(name="l", subnet=subnet, workdir=CACHE / "lab-l")
    shutil.rmtree(lab.hosts_dir, ignore_errors=True)
    shutil.rmtree(work / "state", ignore_errors=True)  # every run starts from fresh hosts and an empty stack
    lab.setup()
    try:
        t = time.monotonic()
        hosts = [lab.prepare(int(n["address"].rsplit(".", 1)[1]) - 20, hostname=f"node{i + 1}") for i, n in enumerate(nodes)]
        for node, h in zip(nodes, hosts, strict=True):
            give_hardware(h, node)
            h.start()
        print(f"booted {len(hosts)} hosts in {time.monotonic() - t:.1f}s: " + ", ".join(f"{h.hostname}@{h.addr}" for h in hosts))

        host, port = cfg["servers"][0].rsplit(":", 1)
        cp = ControlPlane(pki_dir, host, int(port)).start()
        tag, url = cfg["agent"]["version"], cfg["agent"]["releaseUrl"]
        publish_release(work / "releases", tag, {"amd64": build_llmgw(tag)}, sign_with=release_signing_key(work))
        rel_host = url.split("//")[1].split(":")[0]
        cert, key = labpki.issue_server_cert(pki_dir, work / "release-tls", "releases", ips=[rel_host], dns=[])
        rel = lab.run_in_netns([sys.executable, "-m", "lab.release_server", "--root", str(work / "releases"),
                                "--bind", rel_host, "--port", url.rsplit(":", 1)[1], "--cert", str(cert), "--key", str(key)],
                               addr_index=int(rel_host.rsplit(".", 1)[1]), cwd=str(REPO), stdout=subprocess.PIPE)
        assert rel.stdout is not None and b"listening" in rel.stdout.readline()

        stack = LabStack(REPO, "local", engine_env(engine_bin(), work / "pulumi-home", work / "state"), echo=True)
        up = stack.up()
        print(f"pulumi up: {'ok' if up.ok else 'FAILED'} in {up.seconds:.1f}s")
        ok = up.ok
        if ok:
            ids = {n["id"] for n in nodes}
            connected = cp.wait_for(ids, timeout=20)
            print(f"control plane sees: {sorted(cp.connected())} ({'all' if connected else 'NOT all'} of {sorted(ids)})")
            print("$ pulumi stack output fleet\n" + stack.cli("stack", "output", "fleet").stdout, end="")
            pv = stack.preview(expect_no_changes=True)
            print(f"pulumi preview --expect-no-changes: {'no changes' if pv.ok else 'CHANGES'} in {pv.seconds:.1f}s")
            before = sum(h.passive_tcp_opens() for h in hosts)
            again = stack.up()
            opened = sum(h.passive_tcp_opens() for h in hosts) - before
            print(f"second pulumi up: {'ok' if again.ok else 'FAILED'} in {again.seconds:.1f}s, {opened} SSH connections")
            ok = connected and pv.ok and again.ok and opened == 0
        if args.keep and ok:
            print("hosts and agents keep running; Ctrl-C to tear down")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        down = stack.destroy()
        print(f"pulumi destroy: {'ok' if down.ok else 'FAILED'} in {down.seconds:.1f}s")
        cp.stop()
        return 0 if ok and down.ok else 1
    finally:
        lab.teardown()


if __name__ == "__main__":
    sys.exit(main())
