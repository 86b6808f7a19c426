"""RFC 9162 Merkle hashing and proofs (:mod:`pipelines.receipts.translog`) against an independent
implementation written here from the RFC's recursive definitions (§2.1.1 MTH, §2.1.3.1 PATH,
§2.1.4.1 PROOF/SUBPROOF), for every tree size 1..64 and every index pair; and the signed
tree heads (:mod:`pipelines.receipts.signing`)."""
from __future__ import annotations

import hashlib

import pytest

from pipelines.receipts import translog


# ------------------------------------------------------------- the independent reference (RFC 9162)
def ref_leaf(d: bytes) -> bytes:
    return hashlib.sha256(bytes([0]) + d).digest()


def ref_k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def MTH(D: list[bytes]) -> bytes:
    n = len(D)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return ref_leaf(D[0])
    k = ref_k(n)
    return hashlib.sha256(bytes([1]) + MTH(D[:k]) + MTH(D[k:])).digest()


def PATH(m: int, D: list[bytes]) -> list[bytes]:
    n = len(D)
    if n == 1:
        return []
    k = ref_k(n)
    if m < k:
        return PATH(m, D[:k]) + [MTH(D[k:])]
    return PATH(m - k, D[k:]) + [MTH(D[:k])]


def SUBPROOF(m: int, D: list[bytes], b: bool) -> list[bytes]:
    n = len(D)
    if m == n:
        return [] if b else [MTH(D)]
    k = ref_k(n)
    if m <= k:
        return SUBPROOF(m, D[:k], b) + [MTH(D[k:])]
    return SUBPROOF(m - k, D[k:], False) + [MTH(D[:k])]


def PROOF(m: int, D: list[bytes]) -> list[bytes]:
    return SUBPROOF(m, D, True)


LEAVES = [f"receipt {i}".encode() for i in range(64)]
N_MAX = 64


def _hashes(n):
    return [translog.leaf_hash(x) for x in LEAVES[:n]]


def test_hashes_are_rfc_9162():
    assert translog.leaf_hash(b"abc") == hashlib.sha256(b"\x00abc").digest()
    assert translog.node_hash(b"a" * 32, b"b" * 32) == hashlib.sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()
    assert translog.EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert translog.root([]) == MTH([])


def test_roots_and_prefix_roots_equal_the_recursive_definition():
    roots = list(translog.prefix_roots(_hashes(N_MAX)))
    for n in range(1, N_MAX + 1):
        ref = MTH(LEAVES[:n])
        assert translog.Tree(_hashes(N_MAX), n).root == ref, n
        assert translog.root(_hashes(n)) == ref, n
        assert roots[n - 1] == ref, n


def test_inclusion_proofs_every_size_and_index():
    checked = 0
    for n in range(1, N_MAX + 1):
        tree, root = translog.Tree(_hashes(n)), MTH(LEAVES[:n])
        for m in range(n):
            path = tree.inclusion_proof(m)
            assert path == PATH(m, LEAVES[:n]), (n, m)
            leaf = ref_leaf(LEAVES[m])
            assert translog.verify_inclusion(m, n, leaf, path, root), (n, m)
            # must fail: another leaf, index, size, root, a changed/missing/extra node
            assert not translog.verify_inclusion(m, n, ref_leaf(b"forged"), path, root)
            if n > 1:
                assert not translog.verify_inclusion((m + 1) % n, n, leaf, path, root)
                bad = list(path)
                bad[len(bad) // 2] = bytes(32)
                assert not translog.verify_inclusion(m, n, leaf, bad, root)
                assert not translog.verify_inclusion(m, n, leaf, path[:-1], root)
            # (a wrong size with the right root can pass: the size is bound to the root by the signed head)
            assert not translog.verify_inclusion(m, n + 1, leaf, path, MTH(LEAVES[:n + 1]))
            assert not translog.verify_inclusion(m, n, leaf, path + [bytes(32)], root)
            assert not translog.verify_inclusion(m, n, leaf, path, MTH(LEAVES[:n - 1]) if n > 1 else bytes(32))
            assert not translog.verify_inclusion(n, n, leaf, path, root)
            checked += 1
    assert checked == N_MAX * (N_MAX + 1) // 2
    with pytest.raises(ValueError):
        translog.Tree(_hashes(3)).inclusion_proof(3)


def test_consistency_proofs_every_size_pair():
    checked = 0
    for n in range(1, N_MAX + 1):
        tree, new_root = translog.Tree(_hashes(n)), MTH(LEAVES[:n])
        for m in range(1, n + 1):
            proof = tree.consistency_proof(m)
            old_root = MTH(LEAVES[:m])
            assert proof == PROOF(m, LEAVES[:n]), (m, n)
            assert translog.verify_consistency(m, n, old_root, new_root, proof), (m, n)
            # a forked old tree (one leaf changed) is not a prefix
            forked = list(LEAVES[:m])
            forked[m - 1] = b"forked"
            assert not translog.verify_consistency(m, n, MTH(forked), new_root, proof), (m, n)
            assert not translog.verify_consistency(m, n, old_root, MTH(LEAVES[:n] + [b"x"]), proof), (m, n)
            if proof:
                bad = list(proof)
                bad[-1] = bytes(32)
                assert not translog.verify_consistency(m, n, old_root, new_root, bad), (m, n)
                assert not translog.verify_consistency(m, n, old_root, new_root, proof[:-1]), (m, n)
                assert not translog.verify_consistency(m, n, old_root, new_root, proof + [bytes(32)]), (m, n)
            if m < n:  # the proof for n never proves the tree of n - 1 (the signed head binds size to root)
                assert not translog.verify_consistency(m, n - 1, old_root, MTH(LEAVES[:n - 1]), proof), (m, n)
                assert not translog.verify_consistency(m, n, old_root, new_root, []), (m, n)
            checked += 1
    assert checked == N_MAX * (N_MAX + 1) // 2
    assert translog.verify_consistency(0, 5, translog.EMPTY_ROOT, MTH(LEAVES[:5]), [])
    assert not translog.verify_consistency(6, 5, MTH(LEAVES[:6]), MTH(LEAVES[:5]), [])


def test_signed_tree_heads(tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from pipelines.receipts import signing

    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    h1 = signing.sign_head(key, 1, MTH(LEAVES[:1]), timestamp_ms=1)
    h2 = signing.sign_head(key, 2, MTH(LEAVES[:2]), prev=h1.digest(), timestamp_ms=2)
    pub = key.public_key()
    assert h1.verify(pub) and h2.verify(pub) and not h2.verify(other.public_key())
    assert h1.log_id == hashlib.sha256(signing.public_bytes(pub)).hexdigest()
    assert len(h1.message()) == 16 + 32 + 8 + 8 + 32 + 32
    for field, value in (("tree_size", 3), ("timestamp", 5), ("root_hash", "00" * 32), ("prev", "11" * 32)):
        forged = signing.TreeHead(**{**h2.__dict__, field: value})
        assert not forged.verify(pub), field
    assert signing.TreeHead.from_json(h2.to_json()) == h2
    for fmt in ("pem", "hex"):
        f = tmp_path / f"pub.{fmt}"
        f.write_text(signing.public_key_text(key, fmt))
        assert signing.log_id(signing.load_public_key(f)) == h1.log_id
