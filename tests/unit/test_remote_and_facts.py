"""Remote scripts are values whose variable parts are quoted arguments; facts are pure parsers."""

import shlex
from pathlib import Path

import pytest

from llmgw_pulumi import facts, remote
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


def test_file_contents_travel_on_stdin_not_on_the_command_line():
    key = fake_pem("PRIVATE KEY", "secret").encode()
    script = remote.install_identity([File("/etc/llmgw/agent-key.pem", 0o600, key)], restart_agent=False)
    assert b"secret" not in script.command(sudo=True).encode()
    assert script.stdin == key
    assert "secret" not in repr(script)
    assert "put /etc/llmgw/agent-key.pem 600 " + str(len(key)) in script.text


def test_writes_go_through_a_root_only_temp_file_in_the_target_directory():
    text = remote.install_identity([File("/etc/llmgw/agent-key.pem", 0o600, b"k")], restart_agent=False).text
    assert "umask 077" in text
    assert 'mktemp "$1.llmgw-new.XXXXXX"' in text, "temp file next to the target: the rename is atomic"
    assert 'mv -f "$t" "$1"' in text


def test_agent_install_args_are_positional():
    s = remote.install_agent(mode="release", config="c", unit="u", version="v1.2.3", release_url="https://r.example/x/")
    assert s.args[:3] == ("release", "v1.2.3", "https://r.example/x")
    assert "https://r.example" not in s.text


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


@pytest.mark.parametrize("status,detail,words", [
    ("missing", "", "does not exist"),
    ("not-executable", "-rw-r--r-- root", "not an executable"),
    ("fails", "rc=127; error while loading shared libraries: libgomp.so.1; missing: libgomp.so.1", "exists but will not run"),
])
def test_engine_problems_carry_a_fix_hint(status, detail, words):
    out = f"engine\tllamacpp\t{status}\t{detail}\n"
    probes = facts.parse_engine_probes(out, (("llamacpp", "/opt/llama/llama-server"),))
    problem = facts.engine_problem(probes[0], "gpu-01", "deploy@10.0.0.1")
    assert words in problem["problem"] and "gpu-01" in problem["problem"] or words in problem["problem"]
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
