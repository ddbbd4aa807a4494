// A node on a VM that the same program boots with the VM tool's command line, in Go.
//
// The VM is a local.Command of pulumi-command (registered by its type token: the Go module proxy does not
// serve pulumi-command's Go SDK, and the provider plugin is all the engine needs): create boots it and prints it as JSON, delete stops it, and a
// new image (llmgw:vm.image) replaces it, which re-images the machine. The address comes from the command's
// stdout, so it is unknown in a preview and the node's onboarding waits for the VM. The node is the llmgw
// package's Node component (`pulumi package add` generated its SDK in sdks/llmgw): it is replaced with its VM
// (ReplaceWith), so a re-imaged machine's new SSH host keys are trusted on first use. The VM's address is
// fixed, so the old VM is deleted before its replacement boots, and the engine takes the node off the old
// machine before that.
package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/config"
	"llmgw-pulumi.invalid/sdk/go/llmgw"
)

type vmTool struct {
	Cli  string `json:"cli"`
	Dir  string `json:"dir"`
	Args string `json:"args"`
}

// vmCommand is a command:local:Command of pulumi-command v1.2.1: its stdout is what create printed.
type vmCommand struct {
	pulumi.CustomResourceState

	Stdout pulumi.StringOutput `pulumi:"stdout"`
}

type vmSpec struct {
	Index    int    `json:"index"`
	Hostname string `json:"hostname"`
	Image    string `json:"image"`
}

func quote(word string) string {
	return "'" + strings.ReplaceAll(word, "'", `'\''`) + "'"
}

func main() {
	pulumi.Run(func(ctx *pulumi.Context) error {
		conf := config.New(ctx, "llmgw")
		var tool vmTool
		var spec vmSpec
		var agent llmgw.AgentArgs
		var ssh llmgw.Ssh
		var servers []string
		conf.RequireObject("vmctl", &tool) // the VM tool as this operator runs it
		conf.RequireObject("vm", &spec)
		conf.RequireObject("agent", &agent)
		conf.RequireObject("ssh", &ssh)
		conf.RequireObject("servers", &servers)
		nodeID := conf.Get("nodeId")
		if nodeID == "" {
			nodeID = spec.Hostname
		}
		pkiDir := conf.Require("pkiDir")

		cli := func(verb string) string {
			return fmt.Sprintf("%s %s %s --index %d", tool.Cli, verb, tool.Args, spec.Index)
		}
		var vm vmCommand
		err := ctx.RegisterResource("command:local:Command", "vm", pulumi.Map{
			"create":   pulumi.String(cli("boot") + " --hostname " + quote(spec.Hostname) + " --image " + quote(spec.Image)),
			"delete":   pulumi.String(cli("stop")),
			"dir":      pulumi.String(tool.Dir),
			"triggers": pulumi.Array{pulumi.String(spec.Image)},
		}, &vm, pulumi.DeleteBeforeReplace(true), pulumi.Version("1.2.1"),
			// What the generated SDK says for triggers: a new image is a new machine.
			pulumi.ReplaceOnChanges([]string{"triggers[*]"}))
		if err != nil {
			return err
		}
		address := vm.Stdout.ApplyT(func(out string) (string, error) {
			var booted struct {
				Address string `json:"address"`
			}
			err := json.Unmarshal([]byte(out), &booted)
			return booted.Address, err
		}).(pulumi.StringOutput)

		node, err := llmgw.NewNode(ctx, nodeID, &llmgw.NodeArgs{
			NodeId:  nodeID,
			Address: address,
			PkiDir:  &pkiDir,
			Servers: pulumi.ToStringArray(servers),
			Agent:   agent,
			// An input may be computed, as an Output: here the SSH settings, with a longer wait for a fresh
			// VM's first boot unless the config gives one. Agent and Ssh are read once known; in a preview, one
			// not known yet (computed from the VM's stdout, say) is refused by name: the release is approved
			// and the key found before the node is registered.
			Ssh: pulumi.ToOutput(ssh).ApplyT(func(s llmgw.Ssh) llmgw.Ssh {
				if s.Wait == nil {
					wait := 180.0
					s.Wait = &wait
				}
				return s
			}).(llmgw.SshOutput),
		}, pulumi.DependsOn([]pulumi.Resource{&vm}), pulumi.ReplaceWith([]pulumi.Resource{&vm}))
		if err != nil {
			return err
		}

		ctx.Export("address", address)
		ctx.Export("hostKey", node.HostKey)
		ctx.Export("hostname", node.Hostname)
		ctx.Export("certificateNotAfter", node.CertificateNotAfter)
		ctx.Export("agentVersion", node.AgentVersion)
		ctx.Export("problems", node.Problems)
		ctx.Export("inventory", node.Inventory)
		return nil
	})
}
