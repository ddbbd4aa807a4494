"""The agent's releases: their files and checksums (pure), and their approval."""
