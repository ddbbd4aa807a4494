"""Remote scripts are values whose variable parts are quoted arguments; facts are pure parsers."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw_pulumi import desired, facts, remote
from llmgw_pulumi.desired import File
from tests.unit import fake_pem

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "nvidia-h200"


def test_a_hostile_engine_path_stays_one_argument():
    evil = "/opt/x; touch /tmp/pwned"
    script = remote.probe_engines((("llamacpp", evil),))
    argv = shlex.split(script.command(sudo=True))
    assert argv[:3] == ["sudo", "-n", "--"]
    assert argv[-2:] == ["llamacpp", evil], "the path is passed whole, as data"
    assert evil not in script.text, "the path is never spliced into the script text"


def test_a_script_is_the_same_text_for_every_node():
    key = fake_pem("PRIVATE KEY", "secret")
    a = remote.install_identity(desired.identity_files("CA", "C1", key), restart_agent=False)
    b = remote.install_identity(desired.identity_files("CA2", "C2", "K"), restart_agent=True)
    assert a.text == b.text == remote.program("install-identity.sh")
    c = remote.install_agent(mode="release", config="c", unit="u", version="v1.2.3", release_url="https://r.example/x/")
    assert c.text == remote.install_agent(mode="copy", config="d", unit="v", binary=b"b", binary_sha256="0" * 64).text
    assert c.args[2:5] == ("release", "v1.2.3", "https://r.example/x")
    assert "https://r.example" not in c.text


def test_file_contents_travel_on_stdin_not_on_the_command_line():
    key = fake_pem("PRIVATE KEY", "secret").encode()
    script = remote.install_identity([File("/etc/llmgw/agent-key.pem", 0o600, key)], restart_agent=False)
    assert b"secret" not in script.command(sudo=True).encode()
    assert script.stdin == key
    assert "secret" not in repr(script)
    assert script.args[-5:] == ("file", "/etc/llmgw/agent-key.pem", "0600", "root:root", str(len(key)))


SPEC_IDENTITY_FILES = ("/etc/llmgw/ca.pem", "/etc/llmgw/agent.pem", "/etc/llmgw/agent-key.pem",
                       "/usr/local/share/ca-certificates/llmgw-ca.crt")
SPEC_AGENT_FILES = ("/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml", "/etc/systemd/system/llmgw-agent.service")


def test_the_scripts_are_told_every_file_by_the_desired_state():
    identity = remote.install_identity(desired.identity_files("CA", "C", "K"), restart_agent=False).args
    agent = remote.install_agent(mode="keep", config="c", unit="u").args
    for f in desired.NODE_FILES:
        assert f.path in (identity if f.resource == desired.IDENTITY else agent), f.path
    # The SPEC's files (steps 3 to 8), written out here: the survey reads every one, removal takes the agent's.
    survey = remote.survey().args
    assert (survey[0], survey[-1]) == ("llmgw-agent.service", "--text"), survey
    assert sorted(survey[1:-1]) == sorted([*SPEC_IDENTITY_FILES, *SPEC_AGENT_FILES]), survey
    assert sorted(remote.remove_agent("gpu-01").args[-3:]) == sorted(SPEC_AGENT_FILES)


def test_exit_codes_have_one_source():
    text = remote.script_text("exits.sh")
    assert remote.parse_exits(text) == {e.name: e.value for e in remote.Exit if e.name != "OK"}
    others = "".join(remote.script_text(n) for n in (*remote.SCRIPTS, "prelude.sh"))
    numbers = [int(n) for n in re.findall(r"\b(7[0-9])\b", others)]
    assert numbers == [], "an exit code is written as a number outside exits.sh"


ALL_SCRIPTS = [*remote.SCRIPTS, "prelude.sh", "exits.sh"]


def test_every_script_is_in_the_package_and_no_other():
    shipped = sorted(p.name for p in Path(remote.__file__).parent.joinpath("scripts").glob("*.sh"))
    assert shipped == sorted(ALL_SCRIPTS)


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_sh_parses_every_script(name):
    res = subprocess.run(["sh", "-n"], input=remote.script_text(name), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("name", [*remote.SCRIPTS, "prelude.sh", "exits.sh"])
def test_shellcheck_is_clean_on_every_program_as_it_runs(name):
    """Each program as the node runs it (exits.sh + prelude.sh + the script); the two shared files alone too."""
    assert shutil.which("shellcheck"), "shellcheck is missing: scripts/install.sh installs it (apt-get install shellcheck)"
    parts = ["exits.sh", "prelude.sh", name] if name in remote.SCRIPTS else [name]
    text = "".join(remote.script_text(p) for p in parts)
    res = subprocess.run(["shellcheck", "--shell=sh", "--format=gcc", "-"], input=text, capture_output=True, text=True)
    if res.returncode != 0:
        starts, line = {}, 1
        for p in parts:
            starts[p] = line
            line += remote.script_text(p).count("\n")
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


needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared/fixtures not beside the checkout")


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
