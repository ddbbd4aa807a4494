"""Pure tests: no network, no root."""


def fake_pem(kind: str, body: str) -> str:
    """A PEM-shaped string with no key in it (so no key-shaped text is committed)."""
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----\n"
