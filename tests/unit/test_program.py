"""The program reads every llmgw:* key of the stack, refuses unknown ones, and tells the operator what to check."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pulumi
import pytest

from llmgw_pulumi.config.stack_config import StackConfigError
from llmgw_pulumi.stack import program
from tests.unit.good_configs import STACK

NEXT_STEPS_FOR_TWO = {
    "expect": "within seconds, `llmgw ctl nodes` lists each of these node ids",
    "nodeIds": ["gpu-01", "gpu-02"],
    "refused": "an agent whose node id differs from its certificate's CN, by design "
               "(each certificate issued here has CN = its node id)",
}


@pytest.fixture(autouse=True)
def an_event_loop() -> None:
    """The program makes secret outputs, which need the main thread's event loop: a test run before these that
    ended with ``asyncio.run`` (tests/unit/test_diagnostics.py) leaves it unset."""
    asyncio.set_event_loop(asyncio.new_event_loop())


@pytest.fixture
def stack_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    yield
    pulumi.runtime.set_all_config({}, [])


def problems_of(config: dict[str, str], secret_keys: list[str] | None = None) -> list[tuple[str, str, str, str]]:
    pulumi.runtime.set_all_config(config, secret_keys or [])
    with pytest.raises(StackConfigError) as err:
        program.main()
    return err.value.problems


def test_the_program_raises_config_errors_as_run_errors(stack_config: None) -> None:
    # pulumi-language-python prints a pulumi.RunError's message alone, without a traceback.
    pulumi.runtime.set_all_config({**STACK, "llmgw:sever": "[]"}, [])
    with pytest.raises(pulumi.RunError) as err:
        program.main()
    assert isinstance(err.value, StackConfigError) and [p[1] for p in err.value.problems] == ["sever"]


def test_a_misspelled_top_level_key_is_an_error(stack_config: None) -> None:
    problems = problems_of({**STACK, "llmgw:sever": json.dumps(["cp2.example.net:7443"])})
    assert problems == [("llmgw", "sever", "is not a setting of this project", "did you mean servers?")]


def test_a_misspelled_nested_key_is_an_error(stack_config: None) -> None:
    problems = problems_of({**STACK, "llmgw:ssh": json.dumps({"user": "deploy", "privateKeyPath": "/k", "wiat": 5})})
    assert problems == [("llmgw", "ssh.wiat", "is not an ssh setting", "did you mean wait?")]


def test_a_key_under_a_misspelled_namespace_is_an_error(stack_config: None) -> None:
    problems = problems_of({**STACK, "llmwg:agent": json.dumps({"version": "v1.4.3"}), "aws:region": "eu-west-1"})
    assert [(p[0], p[1]) for p in problems] == [("llmgw", "llmwg:agent")]
    assert "did you mean llmgw:agent?" in problems[0][3]


def test_a_string_where_a_list_belongs_is_named_as_a_string(stack_config: None) -> None:
    # `pulumi config set llmgw:servers cp1:7443` stores a plain string.
    problems = problems_of({**STACK, "llmgw:servers": "cp1:7443"})
    assert [(p[1], p[2].split(",")[0]) for p in problems] == [("servers", "is a string ('cp1:7443')")]
    assert "pulumi config set --path 'llmgw:servers[0]' cp1:7443" in problems[0][3]


def test_keys_passed_in_the_environment_are_read_too(stack_config: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # The language host hands the config to the program as PULUMI_CONFIG (JSON).
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({"llmgw:certificat": "{}"}))
    assert program.config_keys() == ["certificat"]
    problems = problems_of(STACK)
    assert [p[1] for p in problems] == ["certificat"]


def test_a_secret_value_never_reaches_a_message(stack_config: None) -> None:
    secret = "not-an-address-but-a-s3cret"
    problems = problems_of({**STACK, "llmgw:servers": json.dumps([secret]), "llmgw:sshPrivateKey": secret},
                           secret_keys=["llmgw:servers", "llmgw:sshPrivateKey"])
    expected = ("llmgw", "servers",
                "is set as a secret, but only sshPrivateKey, sshKeyPassphrase, caKeyPassphrase and caKey are read as secrets")
    assert expected in [p[:3] for p in problems]
    assert secret not in repr(problems)


def test_next_steps_name_the_nodes_and_the_cn_rule() -> None:
    assert program.next_steps(["gpu-01", "gpu-02"]) == NEXT_STEPS_FOR_TWO


def test_next_steps_are_not_cut_by_the_cli() -> None:
    # The CLI shows at most 150 characters of a line of a string output, then "...".
    steps = program.next_steps([f"gpu-{i:03d}" for i in range(200)])
    assert len(steps["nodeIds"]) == 200
    texts = [v for v in steps.values() if isinstance(v, str)]
    assert len(texts) == 2 and max(len(t) for t in texts) <= 150 and not any("\n" in t for t in texts)


def test_the_next_steps_output_cannot_collide_with_a_node_id() -> None:
    from llmgw_pulumi import validate

    assert validate.node_id(program.NEXT_STEPS_OUTPUT) is not None


def test_run_shows_a_config_error_as_the_only_error(stack_config: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Under `pulumi up`, exit code 32 tells pulumi-language-python the operator already has the message
    # (checked with the CLI: no "an unhandled error occurred" line after the list).
    shown: list[str] = []
    monkeypatch.setattr(pulumi.log, "error", lambda message, *a, **k: shown.append(message))
    pulumi.runtime.set_all_config({**STACK, "llmgw:sever": "[]"}, [])
    with pytest.raises(SystemExit) as exited:
        program.run()
    assert exited.value.code == 32
    assert shown == ["stack config has 1 problem:\n  llmgw: sever: is not a setting of this project\n"
                     "    fix: did you mean servers?"]


def test_up_exports_the_next_steps(stack_config: None, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
            return f"{args.name}-id", dict(args.inputs)

        def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list]:
            return {}, []

    key = tmp_path / "id_ed25519"
    key.write_text("not read in this test")
    key.chmod(0o600)  # a key others can read is refused (tests/unit/test_operator_files.py)
    exported: dict[str, object] = {}
    monkeypatch.setattr(pulumi, "export", lambda name, value: exported.__setitem__(name, value))
    pulumi.runtime.set_mocks(Mocks(), preview=False)
    pulumi.runtime.set_all_config({
        **STACK,
        # Pinned: the release's digests are known without fetching its checksums.txt (no network here).
        "llmgw:agent": json.dumps({"version": "v1.4.2", "releaseUrl": "https://releases.example.net/llmgw",
                                   "sha256": {"amd64": "ab" * 32}}),
        "llmgw:ssh": json.dumps({"user": "deploy", "privateKeyPath": str(key)}),
        "llmgw:nodes": json.dumps([{"id": "gpu-01", "address": "10.0.0.11"}, {"id": "gpu-02", "address": "10.0.0.12"}]),
        "llmgw:pkiDir": str(tmp_path),  # `up` reads its ca.pem before any node
    }, [])
    (tmp_path / "ca.pem").write_text("not read in this test")
    program.main()
    assert exported["nextSteps"] == NEXT_STEPS_FOR_TWO


INTERRUPTED = """
import os, signal, time
from llmgw_pulumi import program
program.exit_quietly_on_interrupt()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(30)
"""


def test_the_stack_program_ends_silently_when_the_engine_interrupts_it():
    done = subprocess.run([sys.executable, "-c", INTERRUPTED], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert (done.returncode, done.stdout, done.stderr) == (program.LANGUAGE_HOST_SHOWN_EXIT, "", "")


@pytest.mark.parametrize("dry_run", [True, False])
def test_an_unreadable_pki_dir_or_ca_pem_warns_in_preview_and_is_refused_by_up(tmp_path, monkeypatch, dry_run):
    from llmgw_pulumi.errors import ConfigError

    warned: list[str] = []
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: dry_run)
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    (tmp_path / "ca.pem").write_text("a CA certificate")
    program.refuse_unreadable_pki_dir(str(tmp_path))  # readable: nothing said
    assert warned == []
    for given, problem in ((tmp_path / "absent", f"cannot read {tmp_path / 'absent'}: it is not a directory"),
                           (tmp_path / "ca.pem", f"cannot read {tmp_path / 'ca.pem'}: it is not a directory"),
                           (tmp_path / "empty", f"cannot read {tmp_path / 'empty' / 'ca.pem'}: it does not exist")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        if dry_run:
            program.refuse_unreadable_pki_dir(str(given))
            assert warned.pop() == (f"llmgw: pkiDir: {problem}; previewing without it; `pulumi up` refuses it "
                                    "(fix: point llmgw:pkiDir at the cluster CA's directory (ca.pem and ca-key.pem, as "
                                    "`llmgw ctl cert init-ca` makes them), readable by the user running pulumi; or "
                                    "choose another signer (llmgw:signer))")
        else:
            with pytest.raises(ConfigError) as refused:
                program.refuse_unreadable_pki_dir(str(given))
            assert (refused.value.node, refused.value.field) == ("llmgw", "pkiDir")
            assert refused.value.message == f"pkiDir: {problem}" and "point llmgw:pkiDir at" in refused.value.fix
