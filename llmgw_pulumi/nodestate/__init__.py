"""A node: what it should hold, what it holds, the plan between, and the scripts that read and change it (pure but for the shell)."""
