"""Onboard the nodes named in this stack's config (stacks/Pulumi.<stack>.yaml) into the llmgw cluster; started by
the engine as a plugin (a TypeScript or Go program's `pulumi package add`), serve the Node component instead.

The project's entry point runs with whichever version of the package is first on the path (the upgrade tests run
earlier ones): the stack program's import is the one every version has, and the plugin's is made only when
serving."""

import sys

import pulumi.runtime

# The engine starts a plugin with arguments and no program monitor; a stack program has a monitor.
if pulumi.runtime.settings.get_monitor() is None and len(sys.argv) > 1:
    from llmgw_pulumi.stack.component_host import serve

    serve()
else:
    from llmgw_pulumi import program  # its path before the folders: every version has it (llmgw_pulumi/moved.py)

    if hasattr(program, "exit_quietly_on_interrupt"):  # the upgrade tests run versions without it
        program.exit_quietly_on_interrupt()
    program.run()
