"""Merkle tree hashing and proofs of RFC 9162 (Certificate Transparency 2.0, §2.1), over SHA-256.

* leaf hash ``SHA-256(0x00 || leaf)``, interior node ``SHA-256(0x01 || left || right)``; the
  empty tree hashes to ``SHA-256("")``;
* tree shape of §2.1.1: a list of ``n > 1`` leaves splits at ``k``, the largest power of two
  smaller than ``n``; the left subtree is always perfect;
* inclusion proofs (§2.1.3) and consistency proofs (§2.1.4): generated here from a level table,
  verified by the RFC's iterative algorithms (§2.1.3.2, §2.1.4.2), which never see the leaves.

The level table (:class:`Tree`) holds, at level ``L``, the hash of every aligned block of
``2**L`` leaves, the last block truncated at ``n`` (a lone last node is carried up unchanged).
Every subtree the RFC's recursions name is such a block, so each is one look-up: building the
table costs ``n - 1`` node hashes, a proof ``O(log n)`` look-ups. ``tests/test_translog.py``
checks all of it against the RFC's recursive definitions written independently in the test,
for every tree size 1..64 and every index pair.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence

HASH_LEN = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(leaf: bytes) -> bytes:
    """``SHA-256(0x00 || leaf)``."""
    return hashlib.sha256(b"\x00" + bytes(leaf)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def _level_of(size: int) -> int:
    """The level at which a block of ``size`` leaves is one node: ``ceil(log2(size))``."""
    return (size - 1).bit_length()


class Tree:
    """The level table of the first ``size`` of ``leaf_hashes`` (all of them by default).

    Parameters
    ----------
    leaf_hashes : sequence of 32-byte leaf hashes (:func:`leaf_hash` of each entry), in log order.
    size : tree size, ``0 <= size <= len(leaf_hashes)``.
    """

    def __init__(self, leaf_hashes: Sequence[bytes], size: int | None = None):
        n = len(leaf_hashes) if size is None else int(size)
        if not 0 <= n <= len(leaf_hashes):
            raise ValueError(f"tree size {n} outside 0..{len(leaf_hashes)}")
        self.size = n
        levels = [list(leaf_hashes[:n])]
        while len(levels[-1]) > 1:
            cur = levels[-1]
            nxt = [node_hash(cur[i], cur[i + 1]) for i in range(0, len(cur) - 1, 2)]
            if len(cur) % 2:
                nxt.append(cur[-1])  # a lone last node is carried up unchanged
            levels.append(nxt)
        self._levels = levels

    @property
    def root(self) -> bytes:
        """MTH of the tree (``EMPTY_ROOT`` for size 0)."""
        return self._levels[-1][0] if self.size else EMPTY_ROOT

    def _block(self, lo: int, size: int) -> bytes:
        """MTH(D[lo:lo+size]) for a block the recursions name (aligned; perfect or ending at ``size``)."""
        lv = _level_of(size)
        return self._levels[lv][lo >> lv]

    def inclusion_proof(self, index: int) -> list[bytes]:
        """The audit path of leaf ``index`` (RFC 9162 §2.1.3.1), leaf's sibling first."""
        if not 0 <= index < self.size:
            raise ValueError(f"leaf index {index} outside a tree of size {self.size}")
        out: list[bytes] = []
        lo, n, m = 0, self.size, int(index)
        while n > 1:  # walk from the root to the leaf, collecting the other side of each split
            k = _split(n)
            if m < k:
                out.append(self._block(lo + k, n - k))
                n = k
            else:
                out.append(self._block(lo, k))
                lo, m, n = lo + k, m - k, n - k
        return out[::-1]

    def consistency_proof(self, old_size: int) -> list[bytes]:
        """The consistency proof from the tree of ``old_size`` leaves to this one
        (RFC 9162 §2.1.4.1, ``PROOF(m, D[n])`` for ``0 < m < n``; empty when ``m == n``)."""
        m = int(old_size)
        if not 0 < m <= self.size:
            raise ValueError(f"old tree size {m} outside 1..{self.size}")
        out: list[bytes] = []
        lo, n, whole = 0, self.size, True  # ``whole``: the old tree is exactly this subtree so far
        while m != n:
            k = _split(n)
            if m <= k:
                out.append(self._block(lo + k, n - k))
                n = k
            else:
                out.append(self._block(lo, k))
                lo, m, n, whole = lo + k, m - k, n - k, False
        if not whole:
            out.append(self._block(lo, n))
        return out[::-1]


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH of ``leaf_hashes``."""
    return Tree(leaf_hashes).root


def prefix_roots(leaf_hashes: Iterable[bytes]) -> Iterator[bytes]:
    """MTH of the first 1, 2, 3, … leaves, incrementally (``O(log n)`` node hashes each).

    The tree of ``n = 2**a + 2**b + …`` (a > b > …) leaves is ``node(P_a, node(P_b, …))`` over the
    perfect subtrees of its binary decomposition, so a stack of perfect subtree roots suffices."""
    stack: list[tuple[int, bytes]] = []  # (leaves, hash) of perfect subtrees, largest first
    for h in leaf_hashes:
        size, cur = 1, h
        while stack and stack[-1][0] == size:
            s, left = stack.pop()
            cur, size = node_hash(left, cur), size + s
        stack.append((size, cur))
        r = stack[-1][1]
        for _, left in reversed(stack[:-1]):
            r = node_hash(left, r)
        yield r


def verify_inclusion(index: int, tree_size: int, leaf: bytes, path: Sequence[bytes], root_hash: bytes) -> bool:
    """RFC 9162 §2.1.3.2: does ``path`` prove leaf hash ``leaf`` at ``index`` in the tree
    ``(tree_size, root_hash)``?"""
    if not 0 <= index < tree_size or any(len(p) != HASH_LEN for p in path):
        return False
    fn, sn, r = int(index), int(tree_size) - 1, bytes(leaf)
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root_hash


def verify_consistency(first: int, second: int, first_hash: bytes, second_hash: bytes,
                       proof: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2: is the tree ``(first, first_hash)`` a prefix of ``(second, second_hash)``?
    Equal sizes need an empty proof and equal hashes; size 0 is a prefix of everything."""
    if not 0 <= first <= second or any(len(p) != HASH_LEN for p in proof):
        return False
    if first == second:
        return not proof and first_hash == second_hash
    if first == 0:
        return not proof and first_hash == EMPTY_ROOT
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # an exact power of two: the old root is itself a node of the new tree
        path.insert(0, bytes(first_hash))
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_hash and sr == second_hash and sn == 0
