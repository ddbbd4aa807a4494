"""Fixtures shared by the unit tests' modules (each module's own fixtures stay in it)."""

from __future__ import annotations

import pulumi
import pytest

from tests.unit import Mocks
from tests.unit.mock_monitor import RecordingMonitor


@pytest.fixture
def monitor() -> RecordingMonitor:
    m = RecordingMonitor()
    pulumi.runtime.set_mocks(Mocks(), preview=False, monitor=m)
    return m
