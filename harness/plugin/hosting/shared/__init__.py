"""What both processes import: the wire, the protocol, the keeper's records, the policy."""
