"""A node's certificate: the policy it must meet, its issuing, and the signers."""
