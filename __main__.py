"""Onboard the nodes named in this stack's config (stacks/Pulumi.<stack>.yaml) into the llmgw cluster."""

from llmgw_pulumi.program import run

run()
