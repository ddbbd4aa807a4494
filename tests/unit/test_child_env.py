"""No process this package starts inherits the stack's decrypted config or what decrypts it (child_env)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from llmgw_pulumi import child_env
from llmgw_pulumi.stack import program

CONFIDENTIAL = {
    "PULUMI_CONFIG": '{"llmgw:caKey": "the CA key\'s text"}',
    "PULUMI_CONFIG_SECRET_KEYS": '["llmgw:caKey"]',
    "PULUMI_CONFIG_PASSPHRASE": "the stack's passphrase",
    "PULUMI_CONFIG_PASSPHRASE_FILE": "/root/passphrase",
    "PULUMI_ACCESS_TOKEN": "pul-0123",
}


def test_the_config_and_what_decrypts_it_are_withheld_and_the_rest_passed_on():
    env = child_env.for_child({"EXTRA": "1"}, environ={**CONFIDENTIAL, "PATH": "/usr/bin", "HOME": "/root"})
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "EXTRA": "1"}


def test_the_backend_token_reaches_only_the_cli_this_package_runs():
    env = child_env.for_child(environ={**CONFIDENTIAL, "PATH": "/usr/bin"}, backend=True)
    assert env == {"PATH": "/usr/bin", "PULUMI_ACCESS_TOKEN": "pul-0123"}


def test_a_local_agent_build_asked_its_version_sees_none_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name, value in CONFIDENTIAL.items():
        monkeypatch.setenv(name, value)
    build = tmp_path / "llmgw"
    # The build names what it inherited in place of a version, if anything.
    build.write_text('#!/bin/sh\nleaked=$(env | grep -c "^PULUMI_CONFIG\\|^PULUMI_ACCESS_TOKEN")\n'
                     'if [ "$leaked" = 0 ]; then echo "llmgw v9.9.9-dev"; else echo "llmgw leaked-$leaked"; fi\n')
    build.chmod(build.stat().st_mode | stat.S_IXUSR)
    program.local_binary.cache_clear()
    try:
        assert program.local_binary(str(build))[1] == "v9.9.9-dev"
    finally:
        program.local_binary.cache_clear()
    assert os.environ["PULUMI_CONFIG"]  # the program's own environment is unchanged
