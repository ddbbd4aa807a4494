// The benchmark's TypeScript program (bench/onboard.py --language-sizes): the stack config's nodes, each
// onboarded with the llmgw package's Node component, as the Python program onboards them.
import * as llmgw from "llmgw-pulumi";
import * as pulumi from "@pulumi/pulumi";

interface NodeEntry { id: string; address: string; port?: number }

const config = new pulumi.Config("llmgw");
const stackWide = {
    pkiDir: config.require("pkiDir"),
    servers: config.requireObject<string[]>("servers"),
    agent: config.requireObject<llmgw.types.input.AgentArgs>("agent"),
    ssh: config.requireObject<llmgw.types.input.SshArgs>("ssh"),
};
export const hostnames = config.requireObject<NodeEntry[]>("nodes").map(n =>
    new llmgw.Node(n.id, { ...stackWide, nodeId: n.id, address: n.address, port: n.port }).hostname);
