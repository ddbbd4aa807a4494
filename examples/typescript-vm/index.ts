// A node on a VM that the same program boots with the VM tool's command line, in TypeScript.
//
// The VM is a `local.Command` of @pulumi/command: `create` boots it and prints it as JSON, `delete` stops it,
// and a new image (llmgw:vm.image) replaces it, which re-images the machine. The address comes from the
// command's stdout, so it is unknown in a preview and the node's onboarding waits for the VM. The node is
// the llmgw package's Node component (`pulumi package add` generated llmgw-pulumi): it is replaced with its
// VM (replaceWith), so a re-imaged machine's new SSH host keys are trusted on first use. The VM's address is
// fixed, so the old VM is deleted before its replacement boots, and the engine takes the node off the old
// machine before that.
import * as command from "@pulumi/command";
import * as llmgw from "llmgw-pulumi";
import * as pulumi from "@pulumi/pulumi";

interface VmTool { cli: string; dir?: string; args?: string }
interface VmSpec { index: number; hostname: string; image: string }

const config = new pulumi.Config("llmgw");
const vmctl = config.requireObject<VmTool>("vmctl"); // the VM tool as this operator runs it
const vmSpec = config.requireObject<VmSpec>("vm");
const nodeId = config.get("nodeId") ?? vmSpec.hostname;

const quote = (word: string): string => `'${word.replace(/'/g, `'\\''`)}'`;
const cli = (verb: string): string =>
    `${vmctl.cli} ${verb} ${vmctl.args ?? ""} --index ${Math.trunc(vmSpec.index)}`;
const vm = new command.local.Command("vm", {
    create: `${cli("boot")} --hostname ${quote(vmSpec.hostname)} --image ${quote(vmSpec.image)}`,
    delete: cli("stop"),
    dir: vmctl.dir,
    triggers: [vmSpec.image],
}, { deleteBeforeReplace: true });
export const address = vm.stdout.apply(out => JSON.parse(out).address as string);

const node = new llmgw.Node(nodeId, {
    nodeId: nodeId,
    address: address,
    pkiDir: config.require("pkiDir"),
    servers: config.requireObject<string[]>("servers"),
    agent: config.requireObject<llmgw.types.input.AgentArgs>("agent"),
    // An input may be computed, as an Output: here the SSH settings, with a longer wait for a fresh VM's
    // first boot unless the config gives one. agent and ssh are read once known; in a preview, one not known
    // yet (computed from the VM's stdout, say) is refused by name: the release is approved and the key found
    // before the node is registered.
    ssh: pulumi.output(config.requireObject<llmgw.types.input.SshArgs>("ssh"))
        .apply(ssh => ({ ...ssh, wait: ssh.wait ?? 180 })),
}, { dependsOn: [vm], replaceWith: [vm] });

export const hostKey = node.hostKey;
export const hostname = node.hostname;
export const certificateNotAfter = node.certificateNotAfter;
export const agentVersion = node.agentVersion;
export const problems = node.problems;
export const inventory = node.inventory;
