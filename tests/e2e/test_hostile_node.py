"""A node's text on the operator's side, on a real host under the CLI (security review M3).

The node's engine and its nvidia-smi fail, printing terminal escape sequences (retitle the terminal, clear
it) and a bidirectional override; the nvidia-smi lives in a directory whose name is shell syntax. `pulumi up`
shows what they printed escaped, and the fix hint for nvidia-smi, pasted into a shell with the real ssh
client, runs that nvidia-smi on the node and nothing else.
"""

from __future__ import annotations

import shlex
import subprocess

import pytest

from tests.conftest import ssh, stack_config

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

SMI_DIR = "/opt/n; touch pwned #"
"""Pasted unquoted, a hint holding it would touch ./pwned: on the operator's machine, or in the login's home."""
SMI = f"{SMI_DIR}/nvidia-smi"
ENGINE = "/opt/llama/llama-server"
SHOUT = r"printf '\033]0;owned\007\033[2J GPU has fallen off the bus \342\200\256 ok\n' >&2; exit 3"
"""What both print before failing: OSC retitle, clear screen, U+202E (right-to-left override)."""


def test_what_a_hostile_node_prints_is_shown_escaped_and_its_hint_runs_only_its_path(cluster, hosts, new_stack, tmp_path):
    (h,) = hosts(1)
    script = f"#!/bin/sh\n{SHOUT}\n"
    for path in (SMI, ENGINE):
        rc, out = ssh(h, cluster, f"sudo mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && "
                                  f"printf '%s' {shlex.quote(script)} | sudo tee {shlex.quote(path)} >/dev/null && "
                                  f"sudo chmod 0755 {shlex.quote(path)}")
        assert rc == 0, out
    config = stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr, "engines": {"llamacpp": {"bin": ENGINE}},
                                                 "discovery": {"nvidiaSmi": SMI}}])
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output

    # What the node printed reached the operator, escaped: no escape byte, no override character.
    assert "\\x1b]0;owned\\x07\\x1b[2J GPU has fallen off the bus \\u202e ok" in up.output, up.output
    assert up.output.count("GPU has fallen off the bus") >= 2, "both the engine's and nvidia-smi's words are shown"
    assert "\x1b]0;owned" not in up.output and "\x1b[2J" not in up.output and "\u202e" not in up.output
    problems = {p.get("engine") or p.get("gpu"): p for p in stack.outputs()[h.hostname]["problems"]}
    assert {k: p["status"] for k, p in problems.items()} == {"llamacpp": "fails", "nvidia-smi": "fails"}
    for p in problems.values():
        assert all(str(v).isprintable() for v in p.values()), p

    # The hint, pasted with the real ssh client (the lab's key and a throwaway known_hosts added to it), runs
    # the nvidia-smi at that path on the node, and the shell syntax in its name runs neither here nor there.
    hint = problems["nvidia-smi"]["hint"]
    command = hint.partition("; usually")[0]
    assert command.startswith(f"ssh deploy@{h.addr} ")
    options = (f"-i {shlex.quote(str(cluster.ssh_key_path))} -o BatchMode=yes -o StrictHostKeyChecking=no "
               f"-o UserKnownHostsFile={shlex.quote(str(tmp_path / 'known_hosts'))}")
    pasted = subprocess.run(["sh", "-c", command.replace("ssh ", f"ssh {options} ", 1)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert pasted.returncode == 3, (pasted.returncode, pasted.stderr)  # the node's nvidia-smi ran, and failed as it does
    assert "GPU has fallen off the bus" in pasted.stderr
    assert not list(tmp_path.glob("*pwned*")), "the hint ran a command here"
    rc, out = ssh(h, cluster, "ls -a ~ /tmp")
    assert rc == 0 and "pwned" not in out, out
    # Positive control: the hint as it was formatted before (unquoted) runs the name's shell syntax here.
    subprocess.run(["sh", "-c", f"ssh {options} deploy@{h.addr} {SMI}"], capture_output=True, cwd=tmp_path, timeout=60)
    assert (tmp_path / "pwned").exists()
