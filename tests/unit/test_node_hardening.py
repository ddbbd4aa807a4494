"""The node side as a non-root user on the node would attack it (issue 17, item 5; review M4, L8, L9).

The package's real scripts, run by tests/fakenode.py under a temporary root:

- an engine, or nvidia-smi, that a user other than root could change is reported
  with its fix and never run (the probe runs as root);
- the test hook that moves the scripts' root cannot be reached from the
  environment, and refuses a root that is `/`;
- a node without flock, or whose /run others can write, is refused before
  anything changes; nothing is removed in /var/tmp.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmgw_pulumi import errors
from llmgw_pulumi.nodestate import commands
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentityProvider
from llmgw_pulumi.ssh import sessions
from tests.fakenode import FakeNode, FakeNodes, with_root
from tests.unit.error_checks import assert_refused
from tests.unit.fake_node_resources import ADDR, CONN, HOST_KEY, agent_binary, agent_inputs, certificate, identity_inputs
from tests.unit.provider_inputs import checked

ENGINE = "/opt/llama/bin/llama-server"
MARKER = "/var/tmp/engine-ran"
"""What a planted engine writes when it is run: its absence proves the probe did not run it."""


def marking_engine(marker: str = MARKER) -> bytes:
    return f"#!/bin/sh\necho \"$0 $*\" >> \"$FAKE_ROOT{marker}\"\necho engine 1.0\n".encode()


def probe(**extra: Any) -> dict[str, Any]:
    inputs = checked(EngineCheckProvider(), {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY,
                                             "fail_on_problems": False, **extra})
    return EngineCheckProvider().create(inputs).outs


def probe_engine(path: str = ENGINE) -> dict[str, Any]:
    return probe(engines={"llamacpp": {"bin": path}})


def ran(node: FakeNode) -> list[str]:
    text = node.read(MARKER)
    return text.decode().splitlines() if text else []


def fix_of(problem: dict[str, Any]) -> str:
    """The command the hint tells the operator to run on the node (the quoted part after the ssh target)."""
    head, _, command = problem["hint"].partition(": ssh deploy@10.0.0.11 ")
    assert head.startswith("make it root's alone (or install "), problem["hint"]
    (on_node,) = shlex.split(command)
    return on_node


# --------------------------------------------------------------------------- M4: engines others could change


def test_a_safe_engine_is_run_which_the_marker_shows(node: FakeNode) -> None:
    """The positive control for the tests below: the probe does run a root-only engine, and it marks."""
    node.write(ENGINE, marking_engine(), 0o755)
    outs = probe_engine()
    assert outs["problems"] == [] and outs["engines_ok"] is True
    assert ran(node) == [f"{node.path(ENGINE)} --version"]


@pytest.mark.parametrize("what, arrange, component, mode_owner", [
    ("its directory is writable by everyone", lambda n: n.path("/opt/llama/bin").chmod(0o777),
     "/opt/llama/bin", "mode 0777, owner root:root"),
    ("a directory further up belongs to a user", lambda n: n.chown("/opt/llama", "llama:llama"),
     "/opt/llama", "mode 0755, owner llama:llama"),
    ("the binary belongs to a user", lambda n: n.chown(ENGINE, "llama:root"),
     ENGINE, "mode 0755, owner llama:root"),
    ("its directory is writable by a group other than root's",
     lambda n: (n.chown("/opt/llama/bin", "root:staff"), n.path("/opt/llama/bin").chmod(0o2775)),
     "/opt/llama/bin", "mode 2775, owner root:staff"),
    ("the binary is writable by everyone", lambda n: n.path(ENGINE).chmod(0o757), ENGINE, "mode 0757, owner root:root"),
])
def test_an_engine_others_could_change_is_reported_with_its_fix_and_not_run(
        node: FakeNode, what: str, arrange: Any, component: str, mode_owner: str) -> None:
    node.write(ENGINE, marking_engine(), 0o755)
    arrange(node)
    outs = probe_engine()
    (problem,) = outs["problems"]
    assert (problem["engine"], problem["status"], problem["path"]) == ("llamacpp", "unsafe", ENGINE), what
    assert problem["problem"] == (f"llamacpp at {ENGINE} was not run on gpu-01: {component} can be changed by a user "
                                  f"other than root ({mode_owner}), who could make the probe, which runs as root, "
                                  "run anything"), what
    assert fix_of(problem) == f"sudo chown root:root {component} && sudo chmod go-w {component}", what
    assert outs["engines_ok"] is False
    assert ran(node) == [], f"{what}: the probe ran the engine"
    assert not node.calls("ldd"), what


def test_the_fix_makes_the_engine_run_again(node: FakeNode) -> None:
    node.write(ENGINE, marking_engine(), 0o755)
    node.chown("/opt/llama", "llama:llama")
    node.path("/opt/llama/bin").chmod(0o777)
    p = EngineCheckProvider()
    outs = probe_engine()
    assert [x["status"] for x in outs["problems"]] == ["unsafe"] and ran(node) == []
    node.chown("/opt/llama", "root:root")  # the operator runs the first fix; the next component is reported
    outs = p.read("gpu-01", outs).outs
    assert "/opt/llama/bin can be changed" in outs["problems"][0]["problem"] and ran(node) == []
    node.path("/opt/llama/bin").chmod(0o755)
    assert p.read("gpu-01", outs).outs["problems"] == []
    assert len(ran(node)) == 1


def test_a_root_owned_group_root_and_a_sticky_directory_are_fine(node: FakeNode) -> None:
    """Writable by root's group, or a sticky world-writable directory (as /tmp) holding a root-owned engine:
    no one else can replace it."""
    node.write(ENGINE, marking_engine(), 0o755)
    node.path("/opt/llama/bin").chmod(0o775)  # group root
    node.write("/srv/shared/engine", marking_engine(), 0o755)
    node.path("/srv/shared").chmod(0o1777)
    outs = probe(engines={"llamacpp": {"bin": ENGINE}, "vllm": {"bin": "/srv/shared/engine"}})
    assert outs["problems"] == [], outs["problems"]
    assert len(ran(node)) == 2


def test_a_symlink_is_followed_and_every_directory_on_the_way_checked(node: FakeNode) -> None:
    """/usr/bin/eng -> ../../opt/llama/current/server, and /opt/llama/current -> builds/7: every directory the
    kernel reads on the way counts, not only those of the path as written or of where it ends."""
    node.write("/opt/llama/builds/7/server", marking_engine(), 0o755)
    node.path("/usr/bin").mkdir(parents=True)
    node.path("/usr/bin/eng").symlink_to("../../opt/llama/current/server")
    node.path("/opt/llama/current").symlink_to("builds/7")
    assert probe_engine("/usr/bin/eng")["problems"] == [] and len(ran(node)) == 1  # all root's: it runs

    node.path("/opt/llama/builds").chmod(0o777)  # neither a prefix of /usr/bin/eng nor of the path written
    (problem,) = probe_engine("/usr/bin/eng")["problems"]
    assert problem["status"] == "unsafe" and "/opt/llama/builds can be changed" in problem["problem"], problem
    assert len(ran(node)) == 1, "the probe ran an engine reached through a directory others can write"

    node.path("/opt/llama/builds").chmod(0o755)
    node.chown("/opt/llama/current", "llama:llama", symlink=True)  # the symlink itself is someone else's
    (problem,) = probe_engine("/usr/bin/eng")["problems"]
    assert "/opt/llama/current can be changed" in problem["problem"], problem
    assert len(ran(node)) == 1


def test_a_missing_engine_where_others_could_put_one_is_reported_as_such(node: FakeNode) -> None:
    node.path("/opt/llama").mkdir(parents=True)
    node.path("/opt/llama").chmod(0o777)
    (problem,) = probe_engine()["problems"]
    assert problem["status"] == "unsafe" and "/opt/llama can be changed" in problem["problem"]
    node.path("/opt/llama").chmod(0o755)
    (problem,) = probe_engine()["problems"]
    assert problem["status"] == "missing"


def test_a_path_with_shell_words_is_quoted_in_the_fix(node: FakeNode) -> None:
    engine = "/opt/my llama;touch /tmp/pwned/server"
    node.write(engine, marking_engine(), 0o755)
    node.path("/opt/my llama;touch /tmp/pwned").chmod(0o777)
    (problem,) = probe_engine(engine)["problems"]
    assert fix_of(problem) == ("sudo chown root:root '/opt/my llama;touch /tmp/pwned' "
                               "&& sudo chmod go-w '/opt/my llama;touch /tmp/pwned'")
    assert ran(node) == []


def test_nvidia_smi_others_could_change_is_not_run(node: FakeNode) -> None:
    smi = "/opt/nvidia/bin/nvidia-smi"
    node.write(smi, marking_engine(), 0o755)
    node.path("/opt/nvidia").chmod(0o777)
    outs = probe(discovery={"nvidia_smi": smi})
    (problem,) = outs["problems"]
    assert (problem["gpu"], problem["status"], problem["path"]) == ("nvidia-smi", "unsafe", smi)
    assert problem["problem"].startswith(f"nvidia-smi at {smi} was not run on gpu-01: /opt/nvidia can be changed")
    assert fix_of(problem) == "sudo chown root:root /opt/nvidia && sudo chmod go-w /opt/nvidia"
    assert outs["engines_ok"] is True, "nvidia-smi is not an engine"
    assert ran(node) == []
    node.path("/opt/nvidia").chmod(0o755)  # positive control: root's alone, it runs (and fails: it is no nvidia-smi)
    probe(discovery={"nvidia_smi": smi})
    assert ran(node) != []


def probe_with_a_program_on_path_others_can_write(node: FakeNode, name: str, **extra: Any) -> tuple[Path, dict[str, Any]]:
    """(the directory, the one problem) of a probe while ``name``, a marking program, is in a directory of the
    fake's PATH (its stand-ins, then this machine's) that everyone can write."""
    shared = node.bin
    (shared / name).write_bytes(marking_engine())
    (shared / name).chmod(0o755)
    shared.chmod(0o777)
    try:
        (problem,) = probe(**extra)["problems"]
    finally:
        shared.chmod(0o755)
    return shared, problem


def test_nvidia_smi_found_on_path_in_a_directory_others_can_write_is_not_run(node: FakeNode) -> None:
    shared, problem = probe_with_a_program_on_path_others_can_write(node, "nvidia-smi")
    assert problem["status"] == "unsafe" and f"{shared} can be changed" in problem["problem"], problem
    assert ran(node) == []


# --------------------------------------------------------------------------- L8: the test hook


def survey_of(node: FakeNode, path: str, text: str, env: dict[str, str]) -> str:
    res = subprocess.run(["sh", "-c", text, "sh", "llmgw-agent.service", path], capture_output=True, text=True,
                         env={"PATH": ":".join(node.path_dirs), "FAKE_STATE": str(node.state), **env})
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_environment_cannot_move_the_root(node: FakeNode) -> None:
    planted = "/etc/llmgw-hardening-test/only-in-the-fake-root"
    assert not Path(planted).exists()
    node.write(planted, b"x")
    text = commands.survey().text
    # The package's own text, with every variable an older version or a node's setting could have used:
    seen = survey_of(node, planted, text, {"LLMGW_ROOT": str(node.root), "R": str(node.root)})
    assert f"file\t{planted}\t-" in seen.splitlines(), seen
    # Positive control: the harness's hook does move it.
    seen = survey_of(node, planted, with_root(text, node.root), {})
    assert f"file\t{planted}\t644 root root\t" in seen, seen


@pytest.mark.parametrize("root", ["/", "//", "/tmp/..", "relative/dir", "/no/such/dir"])
def test_a_test_root_that_is_slash_or_no_directory_is_refused(node: FakeNode, root: str) -> None:
    res = subprocess.run(["sh", "-c", with_root(commands.survey().text, Path(root)), "sh", "x"], capture_output=True,
                         text=True, env={"PATH": ":".join(node.path_dirs), "FAKE_STATE": str(node.state)})
    assert res.returncode == 2 and "refusing the test root" in res.stderr, (res.returncode, res.stderr)
    assert res.stdout == ""


# --------------------------------------------------------------------------- L9 and the staging sweep


def install_identity(pki_dir: Path) -> Any:
    return NodeIdentityProvider().create(identity_inputs(certificate(pki_dir)))


def test_without_flock_a_change_is_refused_and_nothing_changed(tmp_path: Path, pki_dir: Path) -> None:
    bare = FakeNode(tmp_path / "bare", hostname="gpu-01", host_key=HOST_KEY, without=("flock",))
    with sessions.use(FakeNodes({ADDR: bare})), pytest.raises(errors.NodeLockUnavailableError) as caught:
        install_identity(pki_dir)
    assert_refused(caught.value, errors.NodeLockUnavailableError, "gpu-01")
    assert "this node has no flock (util-linux)" in caught.value.message
    assert bare.files() == [] and bare.calls("update-ca-certificates") == []
    # Positive control: the same node with flock is onboarded.
    with sessions.use(FakeNodes({ADDR: FakeNode(tmp_path / "full", hostname="gpu-01", host_key=HOST_KEY)})):
        install_identity(pki_dir)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_a_run_directory_others_can_write_is_refused(node: FakeNode, pki_dir: Path, mode: int) -> None:
    node.path("/run").chmod(mode)
    with pytest.raises(errors.NodeLockUnavailableError, match=f"/run must be a directory only root can write, "
                                                              f"but it is {mode:o} root:root"):
        install_identity(pki_dir)
    assert [f for f in node.files() if not f.startswith("/run")] == []


def test_leftovers_are_swept_in_run_but_nothing_is_removed_in_var_tmp(node: FakeNode, pki_dir: Path) -> None:
    for d in ("/run/llmgw-stage.Ab12Cd", "/var/tmp/llmgw-stage.Ef34Gh"):
        node.write(f"{d}/bin", b"left by a run killed outright")
    install_identity(pki_dir)
    assert not node.path("/run/llmgw-stage.Ab12Cd").exists(), "the sweep under the lock did not run"
    assert node.read("/var/tmp/llmgw-stage.Ef34Gh/bin") == b"left by a run killed outright"


# --------------------------------------------------------------------------- L5: directories followed through symlinks


def symlinked_dir(node: FakeNode, path: str, target: str) -> None:
    """Make the node's directory ``path`` a symlink to ``target`` (both absolute on the node), written relative so
    that it resolves inside the fake root, as an operator who moved it there would have done."""
    real = node.path(target)
    real.mkdir(parents=True, exist_ok=True)
    link = node.path(path)
    if link.is_dir() and not link.is_symlink():
        link.rmdir()
    link.symlink_to(Path("/".join([".."] * (path.strip("/").count("/")))) / target.lstrip("/"))
    assert link.resolve() == real.resolve()


def test_an_install_directory_that_is_a_symlink_is_checked_where_it_points(node: FakeNode, tmp_path: Path) -> None:
    """/usr/local/bin -> /opt/x/bin, with /opt/x a user's: the user could swap the binary root runs. Refused before
    anything is written, naming /opt/x and its fix; root's alone, the same layout installs (positive control)."""
    node.path("/etc/llmgw").mkdir(mode=0o755)  # the identity is installed
    build = tmp_path / "llmgw"
    build.write_bytes(agent_binary("v1.2.3-4-gabcdef"))
    symlinked_dir(node, "/usr/local/bin", "/opt/x/bin")
    node.chown("/opt/x", "deploy:deploy")
    with pytest.raises(errors.UnsafeDirectoryError) as raised:
        AgentInstallProvider().create(agent_inputs(build))
    assert "/opt/x is owned by deploy:deploy" in str(raised.value), raised.value
    assert "chown root:root /opt/x && chmod go-w /opt/x" in str(raised.value)
    assert node.read("/opt/x/bin/llmgw") is None and node.read("/etc/llmgw/agent.yaml") is None
    node.chown("/opt/x", "root:root")
    AgentInstallProvider().create(agent_inputs(build))
    assert node.read("/opt/x/bin/llmgw") == build.read_bytes()


def test_the_ca_anchor_directory_is_checked_through_its_symlink_before_it_is_changed(node: FakeNode,
                                                                                   pki_dir: Path) -> None:
    """ensure_dir would chown and chmod the directory a symlinked /usr/local/share/ca-certificates points to; with
    a user's directory on the way, nothing is changed there (no chown, no anchor) and the error names it."""
    symlinked_dir(node, "/usr/local/share/ca-certificates", "/srv/home/ml/ca")
    node.chown("/srv/home/ml", "ml:ml")
    arranged = len(node.chowns)
    with pytest.raises(errors.UnsafeDirectoryError) as raised:
        install_identity(pki_dir)
    assert "/srv/home/ml is owned by ml:ml" in str(raised.value), raised.value
    assert node.chowns[arranged:] == []
    assert list(node.path("/srv/home/ml/ca").iterdir()) == [] and node.calls("update-ca-certificates") == []
    node.chown("/srv/home/ml", "root:root")
    install_identity(pki_dir)
    assert [p.name for p in node.path("/srv/home/ml/ca").iterdir()] != []


@pytest.mark.parametrize("mode", [0o1777, 0o775])
def test_a_sticky_or_root_group_writable_install_directory_is_refused_too(node: FakeNode, tmp_path: Path,
                                                                          mode: int) -> None:
    """The probe lets an engine sit in a sticky /tmp or a root-group-writable directory; an install directory must
    be root's alone (the rollback copies and markers are made there by name)."""
    node.path("/etc/llmgw").mkdir(mode=0o755)
    build = tmp_path / "llmgw"
    build.write_bytes(agent_binary("v1.2.3-4-gabcdef"))
    node.path("/usr/local").chmod(mode)
    with pytest.raises(errors.UnsafeDirectoryError, match=f"/usr/local is owned by root:root with mode {mode:o}"):
        AgentInstallProvider().create(agent_inputs(build))
    assert node.read("/usr/local/bin/llmgw") is None


# --------------------------------------------------------------------------- N5: what runs before the engine's own code

ENGINE_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/var/tmp/engine-ran", getenv("FAKE_ROOT") ? getenv("FAKE_ROOT") : "");
    FILE *f = fopen(path, "a");
    if (f) { fprintf(f, "%s %s\n", argv[0], argc > 1 ? argv[1] : ""); fclose(f); }
    puts("engine 1.0");
    return 0;
}
"""


def elf_engine(tmp_path: Path, *link_flags: str) -> bytes:
    """A real ELF engine, built here with gcc and ``link_flags`` (a RUNPATH, an ELF interpreter); it marks like
    marking_engine when run."""
    src = tmp_path / "engine.c"
    src.write_text(ENGINE_C)
    out = tmp_path / "engine"
    subprocess.run(["gcc", "-o", str(out), str(src), *link_flags], check=True, capture_output=True)
    return out.read_bytes()


def test_an_engine_whose_interpreter_others_could_change_is_not_run(node: FakeNode) -> None:
    """#!/opt/py/bin/python, with /opt/py/bin a user's: the kernel runs that interpreter, as root, first."""
    node.write(ENGINE, b"#!/opt/py/bin/python -u\nprint('engine 1.0')\n", 0o755)
    node.write("/opt/py/bin/python", marking_engine(), 0o755)
    node.chown("/opt/py/bin", "ml:ml")
    (problem,) = probe_engine()["problems"]
    assert (problem["status"], problem["path"]) == ("unsafe", ENGINE), problem
    assert "/opt/py/bin can be changed by a user other than root (mode 0755, owner ml:ml)" in problem["problem"]
    assert fix_of(problem) == "sudo chown root:root /opt/py/bin && sudo chmod go-w /opt/py/bin"
    assert ran(node) == []
    node.chown("/opt/py/bin", "root:root")  # positive control: root's alone, the probe tries it (the fake's kernel
    (problem,) = probe_engine()["problems"]  # looks for /opt/py on this machine, so it fails to start)
    assert problem["status"] == "fails", problem


def test_an_interpreter_env_finds_on_path_where_others_can_write_is_not_run(node: FakeNode) -> None:
    node.write(ENGINE, b"#!/usr/bin/env enginepy\n", 0o755)
    shared, problem = probe_with_a_program_on_path_others_can_write(node, "enginepy",
                                                                   engines={"llamacpp": {"bin": ENGINE}})
    assert problem["status"] == "unsafe" and f"{shared} can be changed" in problem["problem"], problem
    assert ran(node) == []
    assert probe_engine()["problems"] == [] and len(ran(node)) == 1  # positive control: env runs it


def test_an_env_others_could_change_is_not_run(node: FakeNode) -> None:
    """#!/opt/tools/env enginepy: env itself runs first, as root."""
    node.write(ENGINE, b"#!/opt/tools/env enginepy\n", 0o755)
    node.write("/opt/tools/env", marking_engine(), 0o755)
    node.chown("/opt/tools/env", "ml:ml")
    (problem,) = probe_engine()["problems"]
    assert problem["status"] == "unsafe" and "/opt/tools/env can be changed" in problem["problem"], problem


@pytest.mark.parametrize("flags, component", [
    (("-Wl,--enable-new-dtags", "-Wl,-rpath,/opt/llama/lib"), "/opt/llama/lib"),
    (("-Wl,--disable-new-dtags", "-Wl,-rpath,/usr/lib/llmgw:/opt/llama/lib"), "/opt/llama/lib"),
    (("-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/../lib"), "/opt/llama/lib"),
])
def test_an_elf_engine_whose_runpath_others_could_write_is_not_run(node: FakeNode, tmp_path: Path,
                                                                  flags: tuple[str, ...], component: str) -> None:
    """The dynamic loader looks for the engine's libraries in its RUNPATH (or RPATH) first: a library planted there
    runs as root before main."""
    node.write(ENGINE, elf_engine(tmp_path, *flags), 0o755)
    node.path("/opt/llama/lib").mkdir()
    assert probe_engine()["problems"] == [] and len(ran(node)) == 1  # positive control: root's alone, it runs
    node.path("/opt/llama/lib").chmod(0o777)
    (problem,) = probe_engine()["problems"]
    assert problem["status"] == "unsafe" and f"{component} can be changed" in problem["problem"], problem
    assert fix_of(problem) == f"sudo chown root:root {component} && sudo chmod go-w {component}"
    assert len(ran(node)) == 1, "the probe ran an engine whose RUNPATH others can write"


def test_an_elf_engine_whose_elf_interpreter_others_could_change_is_not_run(node: FakeNode, tmp_path: Path) -> None:
    node.write(ENGINE, elf_engine(tmp_path, "-Wl,--dynamic-linker=/opt/ld/ld-linux.so"), 0o755)
    node.write("/opt/ld/ld-linux.so", b"", 0o755)
    node.chown("/opt/ld/ld-linux.so", "ml:ml")
    (problem,) = probe_engine()["problems"]
    assert problem["status"] == "unsafe" and "/opt/ld/ld-linux.so can be changed" in problem["problem"], problem
    node.chown("/opt/ld/ld-linux.so", "root:root")  # positive control: root's, it is tried (and fails: no loader)
    (problem,) = probe_engine()["problems"]
    assert problem["status"] == "fails", problem


def test_nvidia_smi_whose_runpath_others_could_write_is_not_run(node: FakeNode, tmp_path: Path) -> None:
    smi = "/opt/nvidia/bin/nvidia-smi"
    node.write(smi, elf_engine(tmp_path, "-Wl,-rpath,/opt/nvidia/lib"), 0o755)
    node.path("/opt/nvidia/lib").mkdir()
    node.chown("/opt/nvidia/lib", "ml:ml")
    (problem,) = probe(discovery={"nvidia_smi": smi})["problems"]
    assert (problem["gpu"], problem["status"]) == ("nvidia-smi", "unsafe") and "/opt/nvidia/lib" in problem["problem"]
    assert ran(node) == []
