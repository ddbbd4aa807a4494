module llmgw.invalid/go-vm

go 1.26

require github.com/pulumi/pulumi/sdk/v3 v3.260.0
