"""Nodes built by this program's own code, with the public API only (not from `llmgw:nodes`).

The fleet is a list in the program; per-node settings are computed here. Only
the addresses (`llmgw:addresses`, node id -> address, as a CMDB or another
stack's outputs would give them) and the cluster settings come from the stack config. Each `Node` runs
its resources in the package's provider process by itself (see
`llmgw_pulumi.stack.shards`), which onboards the nodes in parallel.
"""

import pulumi

from llmgw_pulumi import AgentSettings, BinarySource, ConnectionArgs, Fabric, Node, NodeArgs

FLEET = [
    # (node id, fabric or None)
    ("gpu-a", None),
    ("gpu-b", Fabric(name="ib-east", hcas=["mlx5_0"])),
]

config = pulumi.Config("llmgw")
addresses = config.require_object("addresses")  # node id -> address
ssh = config.require_object("ssh")
agent = config.require_object("agent")

for node_id, fabric in FLEET:
    node = Node(node_id, NodeArgs(
        node_id=node_id,
        connection=ConnectionArgs(host=addresses[node_id], user=ssh.get("user", "root"),
                                  private_key_path=ssh["privateKeyPath"], wait=ssh.get("wait", 120)),
        pki_dir=config.require("pkiDir"),
        settings=AgentSettings(servers=config.require_object("servers"), fabrics=[fabric] if fabric else []),
        binary=BinarySource(version=agent["version"], release_url=agent.get("releaseUrl"),
                            signing_key=agent["signingKey"]),
    ))
    pulumi.export(node_id, {"hostname": node.identity.hostname, "certificate_not_after": node.certificate.not_after})
