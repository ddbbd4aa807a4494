"""What the wheel tells the index and the user's resolver (pyproject.toml's [project]): the metadata a user reads,
and dependency ranges that are bounded at both ends and hold only what the package imports.

Both ends of each range are run by scripts/test-dependency-ranges; tests/lab/test_package.py builds the wheel and
reads its metadata back from an installed copy."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_wheel_says_what_it_is_whose_it_is_and_where_to_read_more() -> None:
    assert PROJECT["description"].strip()
    assert (REPO / PROJECT["readme"]).is_file()
    assert PROJECT["license"] and all((REPO / f).is_file() for f in PROJECT["license-files"])
    assert PROJECT["authors"] and PROJECT["maintainers"]
    assert {"Homepage", "Documentation", "Source", "Changelog"} <= set(PROJECT["urls"])
    assert all(url.startswith("https://") for url in PROJECT["urls"].values())
    assert PROJECT["requires-python"] == ">=3.11"
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers and (REPO / "llmgw_pulumi" / "py.typed").is_file()
    # A Python version is claimed only where the suite runs: the one mypy and ruff target.
    claimed = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert claimed == {"3.11"}
