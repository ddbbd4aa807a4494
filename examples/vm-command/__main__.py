"""A node on a VM that the same program boots with the VM tool's command line.

The VM is a `pulumi_command.local.Command`: `create` boots it and prints it as
JSON, `delete` stops it, and a new image (``llmgw:vm.image``) replaces it,
which re-images the machine. The address comes from the command's stdout, so
it is unknown in a preview and the node's onboarding waits for the VM. The
node is replaced with its VM (``replace_with``): a re-imaged machine has new
SSH host keys, and its new resources trust them on first use. The VM's
address is fixed, so the old VM is deleted before its replacement boots, and
the engine takes the node off the old machine before that.
"""

import json
import shlex

import pulumi
import pulumi_command as command

from llmgw_pulumi import AgentSettings, BinarySource, ConnectionArgs, Node, NodeArgs

config = pulumi.Config("llmgw")
vmctl = config.require_object("vmctl")  # {cli, dir, args}: the VM tool as this operator runs it
vm_spec = config.require_object("vm")  # {index, hostname, image}
ssh = config.require_object("ssh")
agent = config.require_object("agent")
node_id = config.get("nodeId") or vm_spec["hostname"]

cli = f"{vmctl['cli']} {{verb}} {vmctl.get('args', '')} --index {int(vm_spec['index'])}"
vm = command.local.Command(
    "vm",
    create=cli.format(verb="boot") + " " + shlex.join(
        ["--hostname", vm_spec["hostname"], "--image", vm_spec["image"]]),
    delete=cli.format(verb="stop"),
    dir=vmctl.get("dir"),
    triggers=[vm_spec["image"]],
    opts=pulumi.ResourceOptions(delete_before_replace=True),
)
address = vm.stdout.apply(json.loads)["address"]

node = Node(node_id, NodeArgs(
    node_id=node_id,
    connection=ConnectionArgs(host=address, user=ssh.get("user", "root"),
                              private_key_path=ssh["privateKeyPath"], wait=ssh.get("wait", 120)),
    pki_dir=config.require("pkiDir"),
    settings=AgentSettings(servers=config.require_object("servers")),
    binary=BinarySource(version=agent["version"], release_url=agent.get("releaseUrl"),
                        signing_key=agent["signingKey"]),
), pulumi.ResourceOptions(depends_on=[vm], replace_with=[vm]))

pulumi.export("address", address)
pulumi.export("host_key", node.identity.host_key)
pulumi.export("certificate_serial", node.certificate.serial)
