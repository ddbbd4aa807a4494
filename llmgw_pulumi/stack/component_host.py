"""The entry point of this repository as a Pulumi plugin package (PulumiPlugin.yaml): it serves ``Node``.

The Python language host runs the package directory's ``__main__.py`` both as
the stack program (`pulumi up` here) and, for a consumer that ran
``pulumi package add``, as the component's provider; ``__main__.py`` tells
which (a plugin is started with arguments and no program monitor). ``serve()`` hosts llmgw_pulumi.stack.component's ``Node``, with the
input types the package declares (their docs added to the schema), every
input checked as stack config before the component is constructed, and a
clear error when the dynamic-provider plugin would find no Python with this
package.
"""

import json
import sys
from typing import Any

import pulumi
from pulumi.errors import InputPropertiesError
from pulumi.provider import ConstructResult, main
from pulumi.provider.experimental.analyzer import ComponentDefinition
from pulumi.provider.experimental.component import ComponentProvider

from .. import __version__
from . import component


class NodeProvider(ComponentProvider):
    """The component provider of ``Node``: the analyzer's schema, documented; inputs checked first."""

    def __init__(self) -> None:
        version = __version__ if __version__[:1].isdigit() and "+" not in __version__ else "0.0.0"
        super().__init__([component.Node], component.PACKAGE_NAME, version=version)
        self.schema = json.dumps(component.schema_descriptions(json.loads(self.schema or "{}"), component.NODEJS_PACKAGE,
                                                               component.GO_IMPORT_PATH))

    def construct(self, name: str, resource_type: str, inputs: Any,
                  options: pulumi.ResourceOptions | None = None) -> ConstructResult:
        """Every problem (bad inputs, no Python for the dynamic provider) raised as InputPropertiesError, which the
        CLI shows as the list it is; then the component is constructed from what was checked."""
        prepared = component.prepare(name, inputs)
        missing = component.python_problem(name)
        if missing is not None:
            raise InputPropertiesError(missing, [])
        return super().construct(name, resource_type, prepared, options)

    def map_inputs(self, inputs: Any, component_def: ComponentDefinition) -> Any:
        """The inputs ``construct`` prepared, as they are: the stack config's spelling, checked."""
        return inputs


def serve() -> None:
    """Serve the component to the engine (the arguments it started this process with)."""
    main(NodeProvider(), sys.argv[1:])
