"""How a node is reached: the SSH transport, its sessions and keys."""
