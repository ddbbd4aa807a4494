"""Every module path used before the package moved into folders still imports (llmgw_pulumi/moved.py): a program, a
stack or a state that names ``llmgw_pulumi.stack_config`` or ``llmgw_pulumi.providers._glue`` keeps working, and an
upgrade loads the providers from the paths their state records."""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_pulumi.moved import MOVED

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_module_at_its_new_place(old: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


def test_an_old_module_is_importable_from_its_package() -> None:
    from llmgw_pulumi import remote, stack_config  # noqa: F401 - the old names, as a program imports them
    from llmgw_pulumi.providers import _glue

    assert stack_config.__name__ == "llmgw_pulumi.config.stack_config"
    assert remote.__name__ == "llmgw_pulumi.nodestate.commands"
    assert _glue.ModuleProvider is importlib.import_module("llmgw_pulumi.providers.base").ModuleProvider
    assert importlib.import_module("llmgw_pulumi.node").Node is importlib.import_module("llmgw_pulumi").Node


def test_an_old_module_path_names_the_file_it_loads() -> None:
    # Who asks where a module comes from (the upgrade test's probe, a debugger) is told the file, not nothing.
    found = importlib.util.find_spec("llmgw_pulumi.program")
    assert found is not None and found.origin == str(REPO / "llmgw_pulumi" / "stack" / "program.py")


def test_python_m_runs_an_old_module_path() -> None:
    # The command a pull request's CI job runs (examples/ci/preview.sh), by the name it had.
    done = subprocess.run([sys.executable, "-m", "llmgw_pulumi.review", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")


@pytest.mark.parametrize("name", ["agent", "certificate", "engines", "identity"])
def test_a_provider_is_pickled_by_the_module_path_state_records(name: str) -> None:
    # The state holds each provider pickled as ``llmgw_pulumi.providers.<name>.PROVIDER``: that path never moves.
    module = importlib.import_module(f"llmgw_pulumi.providers.{name}")
    assert f"llmgw_pulumi.providers.{name}".encode() in pickle.dumps(module.PROVIDER)
    assert pickle.loads(pickle.dumps(module.PROVIDER)) is module.PROVIDER
    assert f"llmgw_pulumi.providers.{name}" not in MOVED
