"""Reading `pulumi preview --json` for a pull request, and the fleet's rules (pure)."""
