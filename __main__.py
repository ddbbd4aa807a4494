"""Onboard the nodes named in this stack's config (stacks/Pulumi.<stack>.yaml) into the llmgw cluster; started by
the engine as a plugin (a TypeScript or Go program's `pulumi package add`), serve the Node component instead."""

from llmgw_pulumi.component_host import serve, started_as_plugin
from llmgw_pulumi.program import run

if started_as_plugin():
    serve()
else:
    run()
