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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from lab import pki as labpki
from lab.control_plane import ControlPlane
from lab.doubles.infiniband import PortState, install_hca
from lab.doubles.llmgw import build_llmgw
from lab.doubles.nvidia_smi import FIXTURES, Edit, build_nvidia_smi
from lab.hosts import Host, Lab
from lab.release_server import make_signing_key, publish_release
from lab.stack import REPO, LabStack, engine_bin, engine_env

CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))


def give_hardware(host: Host, node: dict[str, Any], *, gpus: int = 8, smi_edits: Sequence[Edit] = (), smi_gpu: int = 0,
                  ports: Mapping[str, Mapping[str, PortState]] | None = None, smi: bool | None = None) -> None:
    """What the lab has none of, in the host's root before it boots: the HCAs a node's fabric declares, as
    directories under its configured ibRoot, each with its ports' sysfs files (port 1 ACTIVE at NDR unless
    ``ports`` says otherwise for that HCA: port -> lab.doubles.infiniband.PortState); and, on a node whose id says
    GPU (or with ``smi``), an nvidia-smi stand-in replaying a real H200 node with ``gpus`` GPUs, its ``-q -x``
    report carrying ``smi_edits`` on GPU ``smi_gpu`` (a fault of tests/fixtures/nvidia-h200/README.md)."""
    ib_root = (node.get("discovery") or {}).get("ibRoot")
    for hca in (node.get("fabric") or {}).get("hcas", []) if ib_root else []:
        install_hca(host.upper / ib_root.lstrip("/"), hca, dict((ports or {}).get(hca) or {}) or None)
    if (node["id"].startswith("gpu") if smi is None else smi) and FIXTURES.is_dir():
        install_nvidia_smi(host, build_nvidia_smi(gpus, edits=smi_edits, gpu=smi_gpu))


def install_nvidia_smi(host: Host, text: str, path: str = "/usr/bin/nvidia-smi") -> None:
    """``text`` as the host's nvidia-smi (root's, mode 0755) before it boots."""
    smi = host.upper / path.lstrip("/")
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(text)
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
