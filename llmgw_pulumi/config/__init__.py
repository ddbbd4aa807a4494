"""What the operator declares: stack config, node list files, the one settings schema, each resource's settings (pure)."""
