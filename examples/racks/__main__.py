"""Onboard this rack's nodes: the node list file its stack names (llmgw:inventory), with the project's shared settings."""

from llmgw_pulumi.stack.program import run

run()
