"""The signed receipt log: the ledger (forget registry), the RFC 9162 Merkle tree, Ed25519 signing and the auditor's checks."""
