"""Fixtures shared by several end-to-end test modules (the lab, the cluster and stacks are tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lab.postgres import Postgres

POSTGRES_STACK = "shared"
"""The name of the stack that operators share in the PostgreSQL backend."""


@pytest.fixture(scope="module")
def postgres(cluster: Any) -> Iterator[Postgres]:
    """A PostgreSQL server (lab/postgres.py) over TLS, certified by the cluster CA, for a module's tests."""
    server = Postgres(cluster.pki_dir).start()
    yield server
    server.stop()
