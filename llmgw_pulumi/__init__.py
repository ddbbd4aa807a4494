"""Pulumi dynamic providers that onboard GPU inference nodes into an llmgw cluster.

    ClientCertificate -> NodeIdentity -> AgentInstall -> EngineCheck

chained by the ``Node`` component. See SPEC.md for what must hold on a node
after `pulumi up`, and README.md for how to run it.
"""

from .errors import (
    AgentStartError,
    AuthenticationError,
    AuthorityError,
    ChecksumMismatchError,
    ConfigError,
    EngineWillNotRunError,
    HostKeyChangedError,
    LlmgwError,
    ReleaseFetchError,
    RemoteCommandError,
    SudoUnavailableError,
    UnreachableError,
)
from .node import ConnectionArgs, Node, NodeArgs
from .providers.agent import AgentInstall, AgentInstallArgs
from .providers.certificate import ClientCertificate, ClientCertificateArgs
from .providers.engines import EngineCheck, EngineCheckArgs
from .providers.identity import NodeIdentity, NodeIdentityArgs

__all__ = [
    "AgentInstall", "AgentInstallArgs", "AgentStartError", "AuthenticationError", "AuthorityError",
    "ChecksumMismatchError", "ClientCertificate", "ClientCertificateArgs", "ConfigError", "ConnectionArgs",
    "EngineCheck", "EngineCheckArgs", "EngineWillNotRunError", "HostKeyChangedError", "LlmgwError", "Node",
    "NodeArgs", "NodeIdentity", "NodeIdentityArgs", "ReleaseFetchError", "RemoteCommandError",
    "SudoUnavailableError", "UnreachableError",
]
