"""Errors asserted as an operator reads them: the error's class, the node and the field it names, and that it gives
a fix. The fix's words are errors.py's, written once there; a test whose point is not those words does not copy
them."""

from __future__ import annotations

from llmgw_pulumi.errors import LlmgwError


def assert_refused(error: BaseException, cls: type[LlmgwError], node: str, field: str | None = None) -> None:
    """``error`` is a ``cls`` (not a subclass) about ``node`` (and ``field``, for a ConfigError) that shows a fix."""
    assert type(error) is cls, f"{type(error).__name__}, not {cls.__name__}: {error}"
    assert isinstance(error, LlmgwError) and error.node == node, error
    if field is not None:
        assert getattr(error, "field", None) == field, error
    assert error.fix.strip(), f"no fix: {error}"
    assert str(error).endswith(f"\n  fix: {error.fix}"), error
