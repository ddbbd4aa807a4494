"""The SSH key file and the signer program on the operator's machine: refused when another user can read the key
or change either (operator_files.exposed), by the program before any node is reached (a preview warns), and by
the command signer before each call.

The files are real, in the test's directory, with the modes and owners set here (the tests run as root, so a
file can be given to another user: ``nobody``).
"""

from __future__ import annotations

import os
import pwd
import types
from pathlib import Path
from typing import Any

import pulumi
import pytest

from llmgw_pulumi import operator_files
from llmgw_pulumi.certificates import signer
from llmgw_pulumi.config import stack_config
from llmgw_pulumi.errors import ConfigError, SignerError
from llmgw_pulumi.stack import program
from tests.unit import Mocks

NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A directory of this user's, 0700, under directories only root can write (pytest's base is 0700)."""
    d = tmp_path / "home"
    d.mkdir(mode=0o700)
    return d


def key_file(where: Path, mode: int = 0o600) -> Path:
    path = where / "id_ed25519"
    path.write_text("the key's text: only the file's mode and owner are read\n")
    path.chmod(mode)
    return path


def program_file(where: Path, mode: int = 0o755) -> Path:
    path = where / "sign.sh"
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(mode)
    return path


def test_a_private_key_and_a_program_of_this_user_alone_pass(home: Path) -> None:
    """The positive control of every refusal below."""
    assert operator_files.exposed(key_file(home), secret=True) is None
    assert operator_files.exposed(program_file(home), secret=False) is None
    assert operator_files.exposed(home / "missing", secret=True) is None  # said by the caller: cannot read it


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602])
def test_a_key_others_can_read_or_write_is_exposed(home: Path, mode: int) -> None:
    path = key_file(home, mode)
    problem, fix = operator_files.exposed(path, secret=True) or ("", "")
    assert str(path) in problem
    assert fix == f"chmod 600 {path}"


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_program_others_can_write_is_exposed(home: Path, mode: int) -> None:
    path = program_file(home, mode)
    problem, fix = operator_files.exposed(path, secret=False) or ("", "")
    assert str(path) in problem and fix == f"chmod go-w {path}"


def test_a_program_others_can_only_read_and_run_is_not(home: Path) -> None:
    assert operator_files.exposed(program_file(home, 0o755), secret=False) is None


@pytest.mark.parametrize("secret", [True, False])
def test_a_file_of_another_user_is_exposed(home: Path, secret: bool) -> None:
    path = key_file(home) if secret else program_file(home)
    os.chown(path, NOBODY, -1)
    problem, fix = operator_files.exposed(path, secret=secret) or ("", "")
    assert str(path) in problem and fix.startswith("chown ") and str(path) in fix


@pytest.mark.parametrize("secret", [True, False])
def test_a_parent_directory_others_can_write_is_exposed(home: Path, secret: bool) -> None:
    inner = home / "keys"
    inner.mkdir()
    path = key_file(inner) if secret else program_file(inner)
    home.chmod(0o777)
    problem, fix = operator_files.exposed(path, secret=secret) or ("", "")
    assert str(home) in problem and str(path) in problem and fix == f"chmod go-w {home}"
    home.chmod(0o1777)  # sticky, as /tmp: only a file's owner may replace a file there
    assert operator_files.exposed(path, secret=secret) is None


def test_a_parent_directory_of_another_user_is_exposed(home: Path) -> None:
    inner = home / "keys"
    inner.mkdir(mode=0o755)
    path = key_file(inner)
    os.chown(inner, NOBODY, -1)
    problem, fix = operator_files.exposed(path, secret=True) or ("", "")
    assert str(inner) in problem and "chown" in fix and str(inner) in fix


def test_a_link_is_judged_by_the_file_it_names(home: Path) -> None:
    path = key_file(home, 0o644)
    link = home / "link"
    link.symlink_to(path)
    problem, fix = operator_files.exposed(link, secret=True) or ("", "")
    assert str(path) in problem and fix == f"chmod 600 {path}"


# --------------------------------------------------------------------------- where they are used


@pytest.fixture(params=[False, True], ids=["up", "preview"])
def preview(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    pulumi.runtime.set_mocks(Mocks(), preview=request.param)
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    yield types.SimpleNamespace(on=request.param, warned=warned)
    pulumi.runtime.set_all_config({}, [])


def test_an_exposed_ssh_key_file_is_refused_for_up_and_warned_of_in_a_preview(home: Path, preview: Any) -> None:
    path = key_file(home, 0o644)
    spec = types.SimpleNamespace(ssh_private_key_path=str(path))
    if preview.on:
        assert program.ssh_credentials(spec, {}) == {"private_key_path": str(path)}  # type: ignore[arg-type]
        assert len(preview.warned) == 1 and str(path) in preview.warned[0] and "chmod 600" in preview.warned[0]
        return
    with pytest.raises(ConfigError) as err:
        program.ssh_credentials(spec, {})  # type: ignore[arg-type]
    assert err.value.field == "ssh.privateKeyPath" and str(path) in err.value.message
    assert err.value.fix == f"chmod 600 {path}"
    path.chmod(0o600)  # the control: the same file, fixed, is taken
    assert program.ssh_credentials(spec, {}) == {"private_key_path": str(path)}  # type: ignore[arg-type]


def test_an_exposed_signer_program_is_refused_for_up_and_warned_of_in_a_preview(home: Path, preview: Any,
                                                                                tmp_path: Path) -> None:
    from lab import pki as labpki

    labpki.init_ca(tmp_path / "pki")
    ca_pem = (tmp_path / "pki" / "ca.pem").read_text()
    path = program_file(home, 0o777)
    given = stack_config.SignerConfig("command", ca_pem, (str(path),))
    if preview.on:
        assert program.signer_inputs(given) == {"kind": "command", "ca_pem": ca_pem, "command": [str(path)]}
        assert len(preview.warned) == 1 and "chmod go-w" in preview.warned[0]
        return
    with pytest.raises(ConfigError) as err:
        program.signer_inputs(given)
    assert err.value.field == "signer.command" and str(path) in err.value.message
    assert err.value.fix == f"chmod go-w {path}"
    path.chmod(0o755)
    assert program.signer_inputs(given) is not None


def test_the_command_signer_checks_its_program_again_before_a_call(home: Path) -> None:
    path = program_file(home)
    signer.CommandSigner((str(path),)).ready("gpu-01")  # the control
    path.chmod(0o775)
    with pytest.raises(SignerError) as err:
        signer.CommandSigner((str(path),)).ready("gpu-01")
    assert err.value.node == "gpu-01" and str(path) in err.value.message and err.value.fix == f"chmod go-w {path}"


# --------------------------------------------------------------------------- the command signer's slots


@pytest.fixture
def no_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $XDG_RUNTIME_DIR; this user's cache directory in the test's directory; /tmp the test's own too."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shared = tmp_path / "shared-tmp"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr("tempfile.tempdir", None)
    return shared


def test_the_slots_live_in_the_runtime_dir_where_there_is_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with signer.slot(("/usr/bin/sign",), 2):
        assert signer.slot_dir() == runtime / "llmgw-signer"
        assert len(list((runtime / "llmgw-signer").iterdir())) >= 1  # the lock file of the slot held
    assert os.stat(runtime / "llmgw-signer").st_mode & 0o777 == 0o700


def test_without_one_they_live_in_the_users_cache_not_in_tmp(no_runtime_dir: Path, tmp_path: Path) -> None:
    # Another user made the name the slots had in /tmp: it is no longer used.
    squatted = no_runtime_dir / f"llmgw-signer-{os.getuid()}"
    squatted.mkdir()
    os.chown(squatted, NOBODY, -1)
    with signer.slot(("/usr/bin/sign",), 2):
        pass
    assert signer.slot_dir() == tmp_path / "cache" / "llmgw-pulumi" / "signer"
    assert os.stat(signer.slot_dir()).st_mode & 0o777 == 0o700
    assert list(squatted.iterdir()) == []


@pytest.mark.parametrize("how", ["another user's", "a link", "open to others"])
def test_a_squatted_slot_directory_is_an_error_naming_it(no_runtime_dir: Path, tmp_path: Path, how: str) -> None:
    where = tmp_path / "cache" / "llmgw-pulumi" / "signer"
    where.parent.mkdir(parents=True)
    if how == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        where.symlink_to(tmp_path / "elsewhere")
    else:
        where.mkdir(mode=0o700)
        if how == "another user's":
            os.chown(where, NOBODY, -1)
        else:
            where.chmod(0o777)
    with pytest.raises(SignerError) as err, signer.slot(("/usr/bin/sign",), 2, node="gpu-01"):
        pass
    assert err.value.node == "gpu-01" and str(where) in err.value.message and str(where) in err.value.fix
