"""Test doubles for what the lab cannot have: the llmgw binary itself."""

from lab.doubles.llmgw import build_llmgw

__all__ = ["build_llmgw"]
