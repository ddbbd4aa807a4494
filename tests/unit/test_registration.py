"""llmgw:registration: the setting (stack config, NodeArgs, AgentInstall's inputs), how a listing is read, and the
check that runs the command (real processes on this machine, a clock of the test's own)."""

from __future__ import annotations

import math
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from llmgw_pulumi import AgentNotRegisteredError
from llmgw_pulumi.config import registration, stack_config
from llmgw_pulumi.config.agent_settings import AgentSettings, BinarySource
from llmgw_pulumi.config.registration import RegistrationCheck, listed, shown
from llmgw_pulumi.config.specs import AgentSpec
from llmgw_pulumi.errors import StackConfigError
from llmgw_pulumi.providers import _registration
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.stack.node import ConnectionArgs, NodeArgs, check_node_args
from tests.unit import RELEASE_KEY
from tests.unit.provider_inputs import AGENT, as_installed, checked

BASE: dict[str, Any] = {
    "pkiDir": "/srv/pki", "servers": ["cp1.example.net:7443"],
    "agent": {"version": "v1.4.2", "signingKey": RELEASE_KEY, "releaseUrl": "https://releases.example.net/llmgw"},
    "ssh": {"user": "deploy", "privateKeyPath": "/home/me/.ssh/id_ed25519"},
    "nodes": [{"id": "gpu-01", "address": "10.0.0.11"}],
}
COMMAND = ["llmgw", "ctl", "nodes", "--server", "cp1.example.net:7443"]


def problems_of(value: Any) -> dict[str, tuple[str, str]]:
    """field -> (problem, fix) of the stack config's problems with llmgw:registration given as ``value``."""
    with pytest.raises(StackConfigError) as raised:
        stack_config.parse({**BASE, "registration": value})
    return {field: (problem, fix) for _, field, problem, fix in raised.value.problems}


# --------------------------------------------------------------------------- the setting


def test_the_stack_config_takes_a_command_and_a_timeout_and_defaults_the_timeout() -> None:
    spec = stack_config.parse({**BASE, "registration": {"command": COMMAND, "timeoutSeconds": 12}})
    assert spec.registration == RegistrationCheck(command=tuple(COMMAND), timeout_seconds=12.0)
    assert stack_config.parse({**BASE, "registration": {"command": COMMAND}}).registration.timeout_seconds == 30.0
    assert stack_config.parse(BASE).registration is None
    assert "registration.command" in stack_config.key_paths() and "registration.timeoutSeconds" in stack_config.key_paths()


@pytest.mark.parametrize(("value", "field"), [
    ({}, "registration.command"),                                       # the command is required
    ({"command": []}, "registration.command"),
    ({"command": ["llmgw", ""]}, "registration.command"),
    ({"command": ["llmgw", 7]}, "registration.command"),
    ({"command": ["llmgw", "ctl\nnodes"]}, "registration.command"),       # not printable
    ({"command": ["bin/llmgw", "ctl", "nodes"]}, "registration.command"),  # relative to nothing known
    ({"command": COMMAND, "timeoutSeconds": 0}, "registration.timeoutSeconds"),
    ({"command": COMMAND, "timeoutSeconds": -1}, "registration.timeoutSeconds"),
    ({"command": COMMAND, "timeoutSeconds": 3601}, "registration.timeoutSeconds"),
    ({"command": COMMAND, "timeoutSeconds": math.nan}, "registration.timeoutSeconds"),
    ({"command": COMMAND, "timeoutSeconds": True}, "registration.timeoutSeconds"),
    ({"command": COMMAND, "timeoutSeconds": "30"}, "registration.timeoutSeconds"),
    ({"command": COMMAND, "timeout": 30}, "registration.timeout"),       # not a registration setting
    (["llmgw", "ctl", "nodes"], "registration"),                          # not a mapping
])
def test_a_bad_registration_setting_is_named_with_a_fix(value: Any, field: str) -> None:
    found = problems_of(value)
    assert list(found) == [field], found
    problem, fix = found[field]
    assert problem and fix


def test_a_command_given_as_one_string_gets_the_commands_that_give_its_words() -> None:
    problem, fix = problems_of({"command": "llmgw ctl nodes"})["registration.command"]
    assert "string" in problem
    assert "`pulumi config set --path 'llmgw:registration.command[2]' nodes`" in fix
    assert "did you mean command?" in problems_of({"comand": COMMAND})["registration.comand"][1]


def test_an_absolute_program_and_a_bare_name_on_path_are_both_accepted() -> None:
    for program in ("/usr/local/bin/llmgw", "llmgw"):
        spec = stack_config.parse({**BASE, "registration": {"command": [program, "ctl", "nodes"]}})
        assert spec.registration.command[0] == program


def test_agent_install_checks_the_input_under_its_input_names() -> None:
    provider = AgentInstallProvider()
    good = checked(provider, {**AGENT, "registration": {"command": COMMAND, "timeout_seconds": 5.0}})
    assert good["registration"] == {"command": COMMAND, "timeout_seconds": 5.0}
    assert AgentSpec.from_props(good).registration == RegistrationCheck(command=tuple(COMMAND), timeout_seconds=5.0)
    assert AgentSpec.from_props(checked(provider, AGENT)).registration is None
    bad = provider.check({}, {**AGENT, "registration": {"command": "llmgw ctl nodes", "timeoutSeconds": 5}})
    reasons = [f.reason for f in bad.failures]
    assert any("registration.command" in r and "Fix:" in r for r in reasons), reasons
    assert any("registration.timeoutSeconds: is not a registration setting" in r for r in reasons), reasons


def test_node_args_problems_name_the_registration_field() -> None:
    args = NodeArgs(node_id="gpu-01", connection=ConnectionArgs(host="10.0.0.11", user="deploy"), pki_dir="/srv/pki",
                    settings=AgentSettings(servers=["cp1:7443"]), binary=BinarySource(version="v1.4.2",
                                                                                   release_url="https://r.example",
                                                                                   signing_key=RELEASE_KEY),
                    registration=RegistrationCheck(command=("bin/llmgw", "ctl", "nodes"), timeout_seconds=0))
    found = {e.field.split(":")[0] for e in check_node_args(args)}
    assert found == {"registration.command", "registration.timeout_seconds"}, check_node_args(args)


def test_a_new_registration_command_is_no_change_to_the_node() -> None:
    # How the operator's side checks registration never restarts an agent; nor does setting it on an old stack.
    provider = AgentInstallProvider()
    olds = as_installed(checked(provider, AGENT))
    given = checked(provider, {**AGENT, "registration": {"command": COMMAND}})
    assert provider.diff("id", olds, given).changes is False
    assert provider.diff("id", as_installed(given), checked(provider, {**AGENT, "registration": {
        "command": ["/usr/bin/true"], "timeout_seconds": 9.0}})).changes is False
    assert provider.diff("id", olds, checked(provider, {**AGENT, "servers": ["cp2:7443"],
                                                        "registration": {"command": COMMAND}})).changes is True


# --------------------------------------------------------------------------- reading a listing


@pytest.mark.parametrize(("output", "expected"), [
    ("gpu-01\n", True),                                          # one id a line
    ("gpu-00\ngpu-01\ngpu-02", True),
    ("NODE      STREAM\ngpu-01    connected\n", True),           # a table, the id its first column
    ("  gpu-01\tconnected\r\n", True),                           # any whitespace around it
    ("NODE      STREAM\n", False),                               # the header alone
    ("", False),
    ("gpu-010\ngpu-0\n", False),                                 # another id that starts or ends alike
    ("GPU-01\n", False),                                         # ids are compared exactly
    ("gpu-02    peer gpu-01\n", False),                          # named, but not as the first word
    ("error: node gpu-01 not found\n", False),
])
def test_a_node_is_listed_when_its_id_is_the_first_word_of_a_line(output: str, expected: bool) -> None:
    assert listed(output, "gpu-01") is expected


def test_what_a_command_printed_is_shown_inert_and_bounded() -> None:
    text = shown("NODE\ngpu-02\x1b[2J\n  fix: run rm -rf /\u202e")
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[2J" in text
    assert all(line.startswith(registration.QUOTE) for line in text.splitlines())  # no line passes for the fix
    long = shown("".join(f"gpu-{i:04d}\n" for i in range(1000)), limit=100)
    assert len(long) < 300 and "gpu-0999" in long and "gpu-0000" not in long and "characters before" in long
    assert shown("") == f"{registration.QUOTE}(nothing)"


# --------------------------------------------------------------------------- running the command


class Clock:
    """A clock that moves only when the check sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def script(tmp_path: Path, body: str, name: str = "ctl") -> Path:
    """An executable Python script of this test's own, private to this user."""
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o700)
    tmp_path.chmod(0o700)
    return path


def test_the_check_runs_the_command_again_until_the_node_is_listed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    ctl = script(tmp_path, f"""
import pathlib
runs = pathlib.Path({str(runs)!r})
n = len(runs.read_text()) if runs.exists() else 0
runs.write_text("x" * (n + 1))
print("NODE STREAM")
if n >= 2:
    print("gpu-01 connected")
""")
    clock = Clock()
    _registration.confirm("gpu-01", RegistrationCheck(command=(str(ctl),), timeout_seconds=10.0), clock=clock, sleep=clock.sleep)
    assert runs.read_text() == "xxx"  # listed on the third run
    assert clock.slept == [_registration.POLL_SECONDS] * 2


def test_a_node_never_listed_fails_with_the_command_what_it_printed_and_the_fix(tmp_path: Path) -> None:
    ctl = script(tmp_path, 'import sys\nprint("NODE STREAM\\ngpu-02 connected")\nprint("gpu-01 refused", file=sys.stderr)\n')
    clock = Clock()
    with pytest.raises(AgentNotRegisteredError) as raised:
        _registration.confirm("gpu-01", RegistrationCheck(command=(str(ctl), "nodes"), timeout_seconds=5.0), clock=clock,
                              sleep=clock.sleep)
    err = raised.value
    assert err.node == "gpu-01"
    assert f"{ctl} nodes" in err.message and "5 s" in err.message
    assert f"{registration.QUOTE}gpu-02 connected" in err.message  # what it printed, quoted
    assert "gpu-01 refused" in err.message  # its stderr too, which never counts as a listing
    assert "journalctl -u llmgw-agent" in err.fix and "certificate" in err.fix
    assert clock.slept == [_registration.POLL_SECONDS] * 4  # five runs, then no time for another: it gave up
    assert clock.now <= 5.0


def test_a_command_that_fails_is_run_again_and_its_exit_status_reported(tmp_path: Path) -> None:
    ctl = script(tmp_path, 'import sys\nprint("cannot ask cp1: connection refused", file=sys.stderr)\nsys.exit(3)\n')
    clock = Clock()
    with pytest.raises(AgentNotRegisteredError) as raised:
        _registration.confirm("gpu-01", RegistrationCheck(command=(str(ctl),), timeout_seconds=3.0), clock=clock, sleep=clock.sleep)
    assert "exited 3" in raised.value.message and "connection refused" in raised.value.message
    assert len(clock.slept) == 2


def test_a_hanging_command_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    ctl = script(tmp_path, "import time\ntime.sleep(60)\n")
    started = time.monotonic()
    with pytest.raises(AgentNotRegisteredError) as raised:
        _registration.confirm("gpu-01", RegistrationCheck(command=(str(ctl),), timeout_seconds=1.0))
    assert time.monotonic() - started < 10
    assert "stopped after" in raised.value.message


def test_the_command_gets_no_stack_config_and_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", '{"llmgw:caKey": "secret"}')
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "hunter2")
    monkeypatch.setenv("LLMGW_TEST_MARKER", "kept")
    seen = tmp_path / "env"
    ctl = script(tmp_path, f"import os, pathlib\npathlib.Path({str(seen)!r}).write_text(repr(dict(os.environ)))\n"
                           "print('gpu-01')\n")
    _registration.confirm("gpu-01", RegistrationCheck(command=(str(ctl),)))
    env = seen.read_text()
    assert "LLMGW_TEST_MARKER" in env  # the positive control: it did see this process's environment
    assert "PULUMI_CONFIG" not in env and "hunter2" not in env


def test_a_bare_name_is_looked_up_on_path_and_a_missing_program_is_named(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    script(tmp_path, "print('gpu-01')\n", name="llmgw-test-ctl")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _registration.confirm("gpu-01", RegistrationCheck(command=("llmgw-test-ctl", "ctl", "nodes")))
    with pytest.raises(AgentNotRegisteredError) as raised:
        _registration.confirm("gpu-01", RegistrationCheck(command=("llmgw-not-installed-here", "ctl", "nodes")))
    assert "llmgw-not-installed-here" in raised.value.message and "absolute path" in raised.value.fix


def test_a_program_another_user_could_change_is_not_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    ctl = script(tmp_path, f"import pathlib\npathlib.Path({str(ran)!r}).write_text('yes')\nprint('gpu-01')\n")
    ctl.chmod(ctl.stat().st_mode | stat.S_IWOTH)
    with pytest.raises(AgentNotRegisteredError) as raised:
        _registration.confirm("gpu-01", RegistrationCheck(command=(str(ctl),)))
    assert "writable by group or others" in raised.value.message and "chmod go-w" in raised.value.fix
    assert not ran.exists()


def test_without_the_setting_nothing_runs() -> None:
    _registration.confirm("gpu-01", None, clock=lambda: pytest.fail("no clock is read"),
                          sleep=lambda _: pytest.fail("nothing is waited for"))
