"""The Pulumi program, the Node component, and what coordinates the nodes of one stack."""
