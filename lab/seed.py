"""The original onboarding script, ../shared/seed/onboard-node.sh, run as an operator ran it, against lab hosts.

Used by the benchmark (its baseline) and by the adoption tests (a node the
script onboarded, then taken over by `pulumi up`). The script is run from its
path, never modified. Its `ssh`/`scp` get the lab key and a throwaway
known_hosts through wrappers first on PATH that add `-F <generated
ssh_config>`: OpenSSH reads ~/.ssh from the passwd home (root's), not $HOME,
so only `-F` keeps /root/.ssh out of it. The generated config includes the
system one after its two lines, so nothing else about OpenSSH changes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEED_SCRIPT = REPO.parent / "shared" / "seed" / "onboard-node.sh"


def operator_binary(path: Path, version: str) -> Path:
    """The llmgw test double as the script's --binary: answers --version with ``version`` and issues
    certificates (`ctl cert issue-client`) with this machine's python."""
    from lab.doubles.llmgw import build_llmgw

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(build_llmgw(version, python=sys.executable))
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def openssh_env(ssh_key_path: Path, host_blocks: str = "") -> Iterator[dict[str, str]]:
    """An environment whose `ssh`/`scp` use ``ssh_key_path`` and a throwaway known_hosts, and no ssh-agent.
    ``host_blocks``: ssh_config `Host` blocks to add (the benchmark's routes through its latency proxies)."""
    with tempfile.TemporaryDirectory(prefix="seed-openssh-") as tmp:
        d = Path(tmp)
        config = d / "ssh_config"
        config.write_text(
            "# lab/seed.py: the lab key and a throwaway known_hosts; the rest is the system config.\n"
            f"IdentityFile {ssh_key_path}\n"
            f"UserKnownHostsFile {d / 'known_hosts'}\n"
            + host_blocks
            + "Include /etc/ssh/ssh_config\n"
        )
        wrappers = d / "bin"
        wrappers.mkdir()
        for tool in ("ssh", "scp"):
            real = shutil.which(tool)
            if real is None:
                raise RuntimeError(f"`{tool}` is not installed (Debian package openssh-client)")
            wrapper = wrappers / tool
            wrapper.write_text(f'#!/bin/sh\nexec {real} -F {config} "$@"\n')
            wrapper.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env["PATH"] = f"{wrappers}:{env.get('PATH', '/usr/bin:/bin')}"
        yield env


def argv(node_id: str, addr: str, *, server: str, pki_dir: Path, binary: Path, release_url: str,
         ssh_user: str = "deploy", ssh_wait: int = 60) -> list[str]:
    """The script's command line for one node."""
    return ["bash", str(SEED_SCRIPT), "--node", node_id, "--addr", addr, "--server", server, "--pki", str(pki_dir),
            "--ssh-user", ssh_user, "--binary", str(binary), "--releases", release_url, "--ssh-wait", str(ssh_wait)]


def onboard(node_id: str, addr: str, env: dict[str, str], **options: object) -> subprocess.CompletedProcess[str]:
    """Run the script for one node to the end; its output is in the result."""
    return subprocess.run(argv(node_id, addr, **options), env=env, cwd="/", capture_output=True, text=True,  # type: ignore[arg-type]
                          timeout=600, check=False)
