"""The signed receipt log: the ledger (forget registry), the RFC 9162 Merkle tree, Ed25519 signing,
the auditor's checks, and its C2SP side (checkpoints, tlog-proofs, witnesses and their client)."""
