"""The engine probe on a real host, as a non-root user of the node would attack it (issue 17, item 5; review M4).

The probe runs each engine's --version as root. An engine in a directory the
node's user `nosudo` (no sudo) owns is one that user can replace with anything: the probe
must report it, with the fix, and not run it. Each stand-in engine records, in a
directory only root can write, that it ran and as whom.
"""

from __future__ import annotations

import base64
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ssh, stack_config

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

RAN = "/var/lib/llmgw-test-ran"
SAFE = "/opt/engines/safe-engine"
THEIRS = "/opt/nosudo-owned/bin"
UNSAFE = f"{THEIRS}/unsafe-engine"


def engine(name: str) -> str:
    return (f"#!/bin/sh\nmkdir -p {RAN} && echo \"$(id -u) $*\" >> {RAN}/{name}\n"
            "case $1 in --version) echo engine 1.0 ;; esac\n")


def probed(host, name: str) -> list[str]:
    """The probe's runs of the engine (``--version``, ``--help``) as the engine recorded them, read from the
    host's filesystem, not through the package. (The agent starts engines too, as ``<path> serve``: that is
    the agent's, not the probe's; an interpreter records it as `<engine> serve`.)"""
    text = host.read_file(f"{RAN}/{name}")
    return [line for line in (text.decode().splitlines() if text else []) if line.split()[-1:] != ["serve"]]


def install(host, cluster, path: str, dir_owner: str) -> None:
    """The engine, root's, 0755, in a directory of ``dir_owner``'s."""
    d = path.rsplit("/", 1)[0]
    command = (f"sudo install -d -o {dir_owner} -g {dir_owner} -m 0755 {d} && printf '%s' {shlex.quote(engine(path.rsplit('/', 1)[1]))}"
               f" | sudo tee {path} >/dev/null && sudo chown root:root {path} && sudo chmod 0755 {path}")
    rc, out = ssh(host, cluster, command)
    assert rc == 0, out


def test_an_engine_a_user_could_replace_is_reported_with_its_fix_and_not_run(cluster, hosts, new_stack):
    (h,) = hosts(1)
    install(h, cluster, SAFE, "root")
    install(h, cluster, UNSAFE, "nosudo")
    assert ssh(h, cluster, f"sudo -u nosudo test -w {THEIRS} && echo nosudo-can-write")[1].strip() == "nosudo-can-write"
    config = stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr,
                                                "engines": {"llamacpp": {"bin": SAFE}, "vllm": {"bin": UNSAFE}}}])
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output

    # Positive control: the probe ran the engine only root can change, as root.
    assert probed(h, "safe-engine") == ["0 --version"]
    # The other it did not run at all, and reported it under the node's EngineCheck with the fix.
    assert probed(h, "unsafe-engine") == [], "the probe ran, as root, an engine the user nosudo can replace"
    problem = (f"vllm at {UNSAFE} was not run on {h.hostname}: {THEIRS} can be changed by a user other than root "
               "(mode 0755, owner nosudo:nosudo)")
    warning = next((d for d in up.diagnostics("warning") if problem in d["message"]), None)
    assert warning is not None, up.output
    assert warning["urn"].endswith(f"llmgw:EngineCheck::{h.hostname}")
    (reported,) = stack.outputs()[h.hostname]["engine_problems"]
    assert (reported["engine"], reported["status"], reported["path"]) == ("vllm", "unsafe", UNSAFE)
    fix = f"sudo chown root:root {THEIRS} && sudo chmod go-w {THEIRS}"
    assert reported["hint"].endswith(f"ssh deploy@{h.addr} {shlex.quote(fix)}"), reported["hint"]

    # The operator runs the fix as given; the next refresh probes again, runs the engine and clears the problem.
    rc, out = ssh(h, cluster, fix)
    assert rc == 0, out
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    assert probed(h, "unsafe-engine") == ["0 --version"]
    checks = [r for r in stack.export()["resources"] if r["type"].endswith("EngineCheck")]
    assert [c["outputs"]["problems"] for c in checks] == [[]]


RECORDING_ELF = r"""
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    mkdir("%(ran)s", 0755);
    FILE *f = fopen("%(ran)s/%(name)s", "a");
    if (f) { fprintf(f, "%%d %%s\n", (int)getuid(), argc > 1 ? argv[1] : ""); fclose(f); }
    puts("engine 1.0");
    return 0;
}
"""


def put_elf(host, cluster, tmp_path: Path, path: str, runpath: str) -> None:
    """An ELF engine built here (the lab hosts run the same Debian) with ``runpath``, root's, 0755, at ``path``;
    it records its runs as the shell engines do."""
    name = path.rsplit("/", 1)[1]
    src, out = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(RECORDING_ELF % {"ran": RAN, "name": name})
    subprocess.run(["gcc", "-O1", "-o", str(out), str(src), "-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"],
                   check=True, capture_output=True)
    data = base64.b64encode(out.read_bytes()).decode()
    d = path.rsplit("/", 1)[0]
    rc, text = ssh(host, cluster, f"sudo install -d -m 0755 {d} && echo {data} | base64 -d | sudo tee {path} >/dev/null"
                                  f" && sudo chown root:root {path} && sudo chmod 0755 {path}")
    assert rc == 0, text


def test_an_engine_whose_interpreter_or_runpath_a_user_could_change_is_not_run(cluster, hosts, new_stack, tmp_path):
    """N5 on a real host: root's engines in root's directories, but one's #! names an interpreter in nosudo's
    tree and another's RUNPATH is a directory nosudo owns. Neither is run (nor that interpreter); an ELF engine
    whose RUNPATH is root's runs (positive control), and fixing the directories as told makes both run."""
    (h,) = hosts(1)
    theirs_py, theirs_lib = "/opt/nosudo-py/bin", "/opt/nosudo-lib"
    install(h, cluster, f"{theirs_py}/python", "nosudo")  # the "interpreter": records that it ran, and as whom
    script = f"#!{theirs_py}/python\n"
    rc, out = ssh(h, cluster, f"sudo install -d -m 0755 /opt/engines && printf '%s' {shlex.quote(script)} | "
                              "sudo tee /opt/engines/py-engine >/dev/null && sudo chmod 0755 /opt/engines/py-engine")
    assert rc == 0, out
    put_elf(h, cluster, tmp_path, "/opt/engines/rpath-engine", theirs_lib)
    put_elf(h, cluster, tmp_path, "/opt/engines/root-rpath-engine", "/opt/engines/lib")
    assert ssh(h, cluster, f"sudo install -d -o nosudo -g nosudo -m 0755 {theirs_lib} /opt/engines/lib")[0] == 0
    engines = {"vllm": {"bin": "/opt/engines/py-engine"}, "sglang": {"python": "/opt/engines/rpath-engine"},
               "llamacpp": {"bin": "/opt/engines/root-rpath-engine"}}
    assert ssh(h, cluster, "sudo chown root:root /opt/engines/lib")[0] == 0
    stack = new_stack(stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr, "engines": engines}]))
    up = stack.up()
    assert up.ok, up.output

    assert probed(h, "root-rpath-engine") == ["0 --version"]  # positive control: a safe ELF engine runs
    assert probed(h, "python") == [], "the probe ran, as root, an interpreter the user nosudo can replace"
    assert probed(h, "rpath-engine") == [], "the probe ran, as root, an engine whose RUNPATH nosudo can write"
    problems = {p["engine"]: p for p in stack.outputs()[h.hostname]["engine_problems"]}
    assert set(problems) == {"vllm", "sglang"}, problems
    assert problems["vllm"]["status"] == problems["sglang"]["status"] == "unsafe"
    for engine, component in (("vllm", theirs_py), ("sglang", theirs_lib)):
        fix = f"sudo chown root:root {component} && sudo chmod go-w {component}"
        assert problems[engine]["hint"].endswith(f"ssh deploy@{h.addr} {shlex.quote(fix)}"), problems[engine]
        assert ssh(h, cluster, fix)[0] == 0

    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    assert probed(h, "python") == ["0 /opt/engines/py-engine --version"]  # it runs the engine: root's now
    assert probed(h, "rpath-engine") == ["0 --version"]


def test_a_node_without_flock_is_refused_before_anything_changes(cluster, hosts, new_stack):
    (h,) = hosts(1)
    rc, out = ssh(h, cluster, "sudo mv /usr/bin/flock /usr/bin/flock.hidden && ! command -v flock")
    assert rc == 0, out
    stack = new_stack(stack_config(cluster, [h]))
    up = stack.up()
    assert not up.ok, up.output
    assert f"{h.hostname}: this node has no flock (util-linux)" in up.output, up.output
    assert "fix: install flock on the node (`apt-get install util-linux`)" in up.output, up.output
    assert ssh(h, cluster, "test -e /etc/llmgw || echo none")[1].strip() == "none", "something was made on the node"

    # Positive control: with flock back, the same stack onboards the node.
    assert ssh(h, cluster, "sudo mv /usr/bin/flock.hidden /usr/bin/flock")[0] == 0
    again = stack.up()
    assert again.ok, again.output
    assert h.read_file("/etc/llmgw/agent.pem") is not None
