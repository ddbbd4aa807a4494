"""The schema's own checks (llmgw_pulumi.schema) word for word: what counts as not known yet, a mapping of nested
settings (unknown keys with the nearest one, then each setting, named under its parent), required settings, and
the one error a resource's check raises (its node, field, problem and fix)."""

from __future__ import annotations

from typing import Any

import pytest
from pulumi.output import Unknown

from llmgw_pulumi import schema, specs
from llmgw_pulumi.agent_settings import Discovery
from llmgw_pulumi.errors import ConfigError
from llmgw_pulumi.schema import Problems, Spelling

UNKNOWN = Unknown()
RELATIVE = ("'bin/nvidia-smi' is relative", "give the absolute path of nvidia-smi on the node, starting with /")


@pytest.mark.parametrize("value, unknown", [
    (UNKNOWN, True), ({"a": UNKNOWN}, True), ({"a": 1, "b": {"c": [1, UNKNOWN]}}, True), ([1, UNKNOWN], True),
    ((UNKNOWN,), True), ({"a": 1, "b": [1, {"c": 2}]}, False), ([], False), ({}, False), ("Unknown", False), (None, False),
])
def test_a_value_is_unknown_when_it_holds_an_unknown_at_any_depth(value: Any, unknown: bool) -> None:
    assert schema.is_unknown(value) is unknown


def _nested(cls: type, value: Any, spelling: Spelling = Spelling.INPUTS, where: str = "settings.discovery") -> list[Any]:
    problems = Problems("gpu-01", spelling)
    schema.nested_settings(cls)(value, problems, where)
    return problems.items


@pytest.mark.parametrize("value,kind", [("/usr/bin/nvidia-smi", "a string ('/usr/bin/nvidia-smi')"),
                                        (["nvidia_smi"], "a list"), (5, "a number (5)")])
def test_nested_settings_that_are_not_a_mapping_are_refused(value: Any, kind: str) -> None:
    assert _nested(Discovery, value) == [("settings.discovery", f"is {kind}, not a mapping of discovery settings",
                                          "pass it as {'nvidia_smi': '...'}")]


def test_nested_settings_not_known_yet_are_checked_when_they_are() -> None:
    assert _nested(Discovery, UNKNOWN) == []


def test_an_unknown_nested_key_is_named_under_its_parent_with_the_nearest_key_in_the_readers_spelling() -> None:
    assert _nested(Discovery, {"nvidia_sm": "/usr/bin/nvidia-smi"}) == [
        ("settings.discovery.nvidia_sm", "is not a discovery setting", "did you mean nvidia_smi?")]
    assert _nested(Discovery, {"nvidiaSm": "/usr/bin/nvidia-smi"}, Spelling.STACK_CONFIG, "nodes[0].discovery") == [
        ("nodes[0].discovery.nvidiaSm", "is not a discovery setting", "did you mean nvidiaSmi?")]
    # Each spelling knows only its own keys: the input name in the stack config is not a setting there.
    assert _nested(Discovery, {"nvidia_smi": "/usr/bin/nvidia-smi"}, Spelling.STACK_CONFIG, "d") == [
        ("d.nvidia_smi", "is not a discovery setting", "did you mean nvidiaSmi?")]
    assert _nested(specs.Rollout, {"zzz": 1}, where="rollout") == [
        ("rollout.zzz", "is not a rollout setting", "use one of canaries, directory, max_parallel")]


def test_nested_settings_are_each_checked_named_under_their_parent() -> None:
    assert _nested(Discovery, {"nvidia_smi": "bin/nvidia-smi", "ib_root": "/sys/class/infiniband"}) == [
        ("settings.discovery.nvidia_smi", *RELATIVE)]
    assert _nested(Discovery, {"nvidiaSmi": "bin/nvidia-smi"}, Spelling.STACK_CONFIG, "nodes[0].discovery") == [
        ("nodes[0].discovery.nvidiaSmi", *RELATIVE)]
    assert _nested(Discovery, {"nvidia_smi": "/usr/bin/nvidia-smi"}) == []


def test_a_required_setting_left_out_is_missing_and_an_optional_one_is_not() -> None:
    problems = Problems("gpu-01")
    schema.collect_fields(specs.Connection, {"user": "deploy"}, problems, prefix="connection.")
    assert problems.items == [("connection.host", "is missing", "give the node's IP address or DNS name")]
    partial = Problems("gpu-01")  # a node's settings that fall back to the stack's
    schema.collect_fields(specs.Connection, {"user": "deploy"}, partial, prefix="connection.", partial=True)
    assert partial.items == []


def test_a_check_raises_its_first_problem_naming_the_node_the_field_and_the_fix() -> None:
    props = {"node_id": "gpu-07", "connection": {"host": "10.0.0.11", "port": 0, "wait": -1}}  # two problems
    with pytest.raises(ConfigError) as err:
        schema.raise_problems(specs.IdentitySpec.collect, props)
    assert err.value.field == "connection.port"
    assert str(err.value) == "gpu-07: connection.port: 0 is not a TCP port\n  fix: use a whole number from 1 to 65535"
    with pytest.raises(ConfigError) as named:
        schema.raise_problems(specs.IdentitySpec.collect, props, "node gpu-07")
    assert str(named.value).startswith("node gpu-07: connection.port: 0 is not a TCP port\n")


def test_a_check_without_a_node_id_names_the_node_question_mark_and_one_without_problems_returns_the_node() -> None:
    with pytest.raises(ConfigError) as err:
        schema.raise_problems(specs.Connection.collect, {"user": "deploy"})
    assert str(err.value) == "?: connection.host: is missing\n  fix: give the node's IP address or DNS name"
    good = {"host": "10.0.0.11", "user": "deploy"}
    assert schema.raise_problems(specs.Connection.collect, {**good, "node_id": "gpu-03"}) == "gpu-03"
    assert schema.raise_problems(specs.Connection.collect, good, "gpu-04") == "gpu-04"
    assert schema.raise_problems(specs.Connection.collect, good) == "?"
