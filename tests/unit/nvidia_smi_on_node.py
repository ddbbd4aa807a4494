"""The lab's nvidia-smi stand-in (lab/doubles/nvidia_smi.py) on a fake node's PATH, replaying the real H200's
output kept in tests/fixtures/nvidia-h200, and the fake node for it: import ``node`` as a module's fixture."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fakenode import FakeNode

# The captured H200 output the stand-in replays, kept in the repository (the files of ../shared/fixtures/nvidia-h200
# the stand-in reads), so that the test runs in every checkout.
CAPTURED = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-h200"


@pytest.fixture
def node(node: FakeNode) -> FakeNode:
    """tests/unit/conftest.py's fake node, where nvidia-smi is only what a test puts on its PATH (skipped on a
    machine with a real nvidia-smi on PATH, which the fake node would find)."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a real nvidia-smi on PATH, which the fake node would find")
    return node


def on_path(node: FakeNode, text: str) -> None:
    """nvidia-smi on the node's PATH (where the fake's stand-ins are)."""
    (node.bin / "nvidia-smi").write_text(text)
    (node.bin / "nvidia-smi").chmod(0o755)
