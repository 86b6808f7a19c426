"""The build's scan at scale keeps every result: the warehouse content hash of the real demo and
of a small generated root (parquet and csv.gz, both vital-sign conventions, in memory and spilling
through many buckets) is the one measured before the scan was reworked; scratch folders are
owner-only; the per-phase CPU figures add up."""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import duckdb
import pytest

import cohort.build.grid as build_grid_mod
from cohort.build import build_warehouse
from cohort.synthetic import generate

#: content hashes measured with the build before the VALUES-join scan (commit 8dde744) and again
#: with integ's build (12b8dc5, IN-list scan) on the same inputs: identical
DEMO_HASH = {"seed": "1e19e7719a8e8cd53f688a605199f424a31c1d5bce4fe3a921b096c78bfc134b",
             "mimic_code": "33de477ab08015c297425025452af7022493cc3c599ecf5fdc5f0433f584da4d"}
GEN_HASH = {"seed": "b1ef022382acb9da8cdad988d1c3e2e905c427ea1977fe346ae5dcc731f1f960",
            "mimic_code": "1d3ba52ab63174a92d8726a7df9febf72f1a8fcfc563365ec28838dcf5852a52"}
#: sha256 of that generated root's chartevents rows (:func:`_input_fingerprint`), so a changed
#: generator is told apart from a changed build
GEN_INPUT = "ad0e44be03e9367d766467bfd4b9dcd0c38e2cafe79f305ff6b003c4d44b0ba5"


def _input_fingerprint(root: Path) -> str:
    con = duckdb.connect()
    try:
        rows = con.execute(
            "SELECT stay_id, epoch_us(charttime), itemid, valuenum "
            f"FROM read_parquet('{root}/icu/chartevents.parquet') ORDER BY ALL").fetchall()
    finally:
        con.close()
    return hashlib.sha256(repr(rows).encode()).hexdigest()


@pytest.fixture(scope="module")
def gen_roots(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen60")
    out = {}
    for fmt in ("parquet", "csv.gz"):
        generate(d / fmt, stays=60, seed=5, fmt=fmt, workers=1)
        out[fmt] = d / fmt
    return out



@pytest.mark.parametrize("convention", ["seed", "mimic_code"])
def test_generated_root_hash_unchanged(gen_roots, tmp_path, convention):
    fp = _input_fingerprint(gen_roots["parquet"])
    if fp != GEN_INPUT:
        pytest.fail(f"the generator's output changed (input {fp[:12]}…, pinned {GEN_INPUT[:12]}…): re-pin GEN_INPUT "
                    "and GEN_HASH with the build of the commit before, not with this test's own result")
    for fmt, root in gen_roots.items():
        a = build_warehouse("mimic", root, tmp_path / f"a_{fmt}.duckdb", progress=False, convention=convention)
        assert a.content_hash == GEN_HASH[convention], fmt
    # spilling DuckDB scratch and one bucket per five stays: the same warehouse
    b = build_warehouse("mimic", gen_roots["parquet"], tmp_path / "b.duckdb", progress=False, convention=convention,
                        memory_limit="100MB", batch_stays=5)
    assert b.content_hash == GEN_HASH[convention]


@pytest.mark.parametrize("convention", ["seed", "mimic_code"])
def test_demo_hash_unchanged(tmp_path, convention):
    from cohort.demo_data import ensure_demo
    from cohort.errors import DemoDataMissing

    try:
        ensure_demo(None)
    except DemoDataMissing as exc:
        pytest.skip(f"real MIMIC-IV demo not available: {exc}")
    s = build_warehouse("demo", None, tmp_path / "demo.duckdb", progress=False, convention=convention)
    assert s.content_hash == DEMO_HASH[convention]


def test_scratch_folders_are_owner_only_and_phases_add_up(gen_roots, tmp_path, monkeypatch):
    modes = {}
    real = build_grid_mod.hourly_means  # the hourly stage (cohort.build.grid) calls it

    def spy(*a, **k):  # mid-build: the spill folder and the bucket spool exist
        for p in tmp_path.iterdir():
            if p.name.endswith((".spill", ".buckets")):
                modes[p.name.rsplit(".", 1)[1]] = stat.S_IMODE(os.lstat(p).st_mode)
        return real(*a, **k)

    monkeypatch.setattr(build_grid_mod, "hourly_means", spy)
    old = os.umask(0o022)  # a permissive umask: the build must not rely on the caller's
    try:
        s = build_warehouse("mimic", gen_roots["parquet"], tmp_path / "w.duckdb", progress=False, batch_stays=20)
    finally:
        os.umask(old)
    assert modes == {"spill": 0o700, "buckets": 0o700}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".spill", ".buckets"))]  # removed afterwards
    assert set(s.cpu_phases) == {"stays", "scan", "hourly", "write", "hash", "finish"}
    assert all(v >= 0 for v in s.cpu_phases.values())
    assert sum(s.cpu_phases.values()) <= s.cpu_seconds + 0.01
