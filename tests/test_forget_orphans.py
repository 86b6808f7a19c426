"""Issue 31, item 3: no orphan copy of a forgotten patient survives a kill -9 at any step of a
forget's rewrite.

A forget runs in a child process that kills itself (SIGKILL) at one named step
(:mod:`pipelines.store.killpoint`: after the receipt; each export file's temporary written and
recorded, and swapped; the task cache removed; the stale marks written; the new warehouse
written, and swapped; the erasure done). A dry run with ``$FORGETFUL_KILL_TRACE`` lists every
step this site passes through. After the kill, the next command is another forget (of a second
patient); then every file of the tree — the warehouse folder, its receipt log, the Parquet and
MEDS exports — is scanned: Parquet and DuckDB files by content (their id columns), every other
file byte for byte (decimal, int32 and int64 encodings of the patients' subject and stay ids),
and no temporary name may remain. Before the forget the same scan finds both patients (the
scan can see them). The default suite kills at three steps (a Parquet export's complete
temporary, a MEDS file's, the new warehouse's); ``-m slow`` kills at every step. Two more
default tests: orphans planted by hand under other (and live) pids, and an export killed after
moving its files into place but before registering them.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main

FORGET_KILL_ENV, TRACE_ENV = "FORGETFUL_FORGET_KILL", "FORGETFUL_KILL_TRACE"  # pipelines.store.killpoint
ROOT = Path(__file__).resolve().parents[1]
CHILD = ("import sys; from pipelines.store.forget import forget_subject\nprint('ready', flush=True)\n"
         "forget_subject(sys.argv[1], subject_id=int(sys.argv[2]), verify=False)\nprint('done', flush=True)")
TEMP_MARKS = (".forget-", ".building-", ".forgetful-export-", ".ingest-init-")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A synthetic warehouse (large ids, so a byte scan means something) and two of its patients."""
    from cohort.synthetic import generate
    from pipelines.flows.clinical_cohort import build_task
    from pipelines.settings import CohortSettings

    d = tmp_path_factory.mktemp("orphans")
    generate(d / "src", stays=8, seed=5, fmt="parquet")
    p = d / "base" / "warehouse.duckdb"
    build_task.fn("mimic", str(d / "src"), str(p), CohortSettings(min_hours=0, memory_limit="512MB"))
    with duckdb.connect(str(p), read_only=True) as con:
        subjects = [r[0] for r in con.execute("SELECT DISTINCT subject_id FROM cohort_stays ORDER BY 1").fetchall()]
        stays = {s: {r[0] for r in con.execute("SELECT stay_id FROM cohort_stays WHERE subject_id = ?",
                                                [s]).fetchall()} for s in subjects[:2]}
    return p, subjects[0], subjects[1], stays


def _site(base, d: Path, capsys) -> Path:
    """A fresh copy of the warehouse with a Parquet and a MEDS export registered, as its own
    configuration's registry (the copies share a source: one copy's forget would otherwise
    already name the patient for the next, :mod:`pipelines.store.registries`)."""
    from pipelines.store.registries import index_path

    index_path().unlink(missing_ok=True)
    p0 = base[0]
    p = d / "runs" / p0.name
    p.parent.mkdir(parents=True)
    shutil.copy(p0, p)
    assert main(["export", "--warehouse", str(p), "--out", str(d / "exports" / "pq")]) == 0
    assert main(["export", "--format", "meds", "--warehouse", str(p), "--out", str(d / "exports" / "meds"),
                 "--shard-subjects", "3"]) == 0
    capsys.readouterr()
    return p


def _child(p: Path, subject: int, env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (FORGET_KILL_ENV, TRACE_ENV)}
    return subprocess.run([sys.executable, "-c", CHILD, str(p), str(subject)], cwd=ROOT, env={**env, **env_extra},
                          capture_output=True, text=True, timeout=300)


def _encodings(i: int) -> list[bytes]:
    out = [str(i).encode(), np.int64(i).tobytes()]
    return out + ([np.int32(i).tobytes()] if -2 ** 31 <= i < 2 ** 31 else [])


def scan(root: Path, subjects: set[int], stays: set[int]) -> list[str]:
    """Where in the tree under ``root`` any of the patients is found (see the module docstring)."""
    hits = []
    for f in sorted(root.rglob("*")):
        rel = str(f.relative_to(root))
        if any(m in f.name for m in TEMP_MARKS):
            hits.append(f"{rel}: temporary name")
        if f.is_symlink() or not f.is_file():
            continue
        data = f.read_bytes()
        if data[:4] == b"PAR1" and data[-4:] == b"PAR1":
            t = pq.read_table(pa.BufferReader(data))
            for col, ids in (("subject_id", subjects), ("stay_id", stays)):
                if col in t.column_names and set(t.column(col).to_pylist()) & ids:
                    hits.append(f"{rel}: {col} column")
        elif data[8:12] == b"DUCK":
            with duckdb.connect(str(f), read_only=True) as con:
                for (t, c) in con.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE column_name IN "
                                          "('subject_id', 'stay_id')").fetchall():
                    ids = subjects if c == "subject_id" else stays
                    n = con.execute(f"SELECT count(*) FROM {t} WHERE {c} IN (SELECT unnest(?::BIGINT[]))",
                                    [sorted(ids)]).fetchone()[0]
                    if n:
                        hits.append(f"{rel}: {t}.{c}")
        else:
            hits += [f"{rel}: raw bytes" for i in subjects | stays if any(e in data for e in _encodings(i))]
    return hits


def _points(base, tmp_path, capsys) -> list[str]:
    """Every kill point a forget of the first patient passes on this site (a dry run)."""
    p = _site(base, tmp_path / "dry", capsys)
    trace = tmp_path / "trace.txt"
    out = _child(p, base[1], {TRACE_ENV: str(trace)})
    assert out.returncode == 0 and "done" in out.stdout, out.stderr[-2000:]
    return trace.read_text().split()


def _kill_then_check(base, d: Path, point: str, capsys) -> None:
    _, target, other, stays = base
    p = _site(base, d, capsys)
    everyone = scan(d, {target, other}, stays[target] | stays[other])
    assert any("exports/pq" in h for h in everyone) and any("exports/meds" in h for h in everyone)
    assert any(h.startswith("runs/warehouse.duckdb:") for h in everyone)  # the scan sees both patients
    out = _child(p, target, {FORGET_KILL_ENV: point})
    assert out.returncode == -signal.SIGKILL, (point, out.returncode, out.stderr[-2000:])
    # the next command: another forget (it sweeps what the kill left, completes the first erasure,
    # and rewrites every export against the whole registry)
    assert main(["forget", "--subject-id", str(other), "--warehouse", str(p), "--no-verify"]) == 0
    capsys.readouterr()
    assert scan(d, {target, other}, stays[target] | stays[other]) == [], point
    assert main(["receipts", "verify", "--warehouse", str(p)]) == 0, point
    capsys.readouterr()


def test_a_kill_at_a_complete_temporary_leaves_no_copy(base, tmp_path, capsys):
    points = _points(base, tmp_path, capsys)
    names = {x.split("#")[0] for x in points}
    assert names == {"forget.committed", "export.written", "export.swapped", "forget.cache_removed",
                     "forget.stale_marked", "warehouse.written", "warehouse.swapped", "forget.erased"}, points
    written = [x for x in points if x.startswith("export.written")]
    assert len(written) >= 3  # hourly.parquet, stays.parquet, the MEDS files
    # the attack's moment (a Parquet export's complete temporary), a MEDS file's, the new warehouse's
    for i, point in enumerate([written[0], written[-1], next(x for x in points if x.startswith("warehouse.written"))]):
        _kill_then_check(base, tmp_path / f"k{i}", point, capsys)


def test_orphan_temporaries_of_any_pid_are_swept_by_the_next_writing_command(base, tmp_path, capsys):
    """What a kill leaves, planted by hand: complete temporaries named for another process — a
    live one's pid too (pids are reused) — in both exports and beside the warehouse."""
    _, target, other, stays = base
    p = _site(base, tmp_path, capsys)
    pq_dir, meds = tmp_path / "exports" / "pq", tmp_path / "exports" / "meds"
    shard, splits = sorted((meds / "data").rglob("*.parquet"))[0], meds / "metadata" / "subject_splits.parquet"
    live, dead = os.getppid(), 2 ** 22 + 4321
    orphans = {pq_dir / f".hourly.parquet.forget-{live}": pq_dir / "hourly.parquet",
               pq_dir / f".stays.parquet.forget-{dead}": pq_dir / "stays.parquet",
               shard.parent / f".{shard.name}.forget-{dead}": shard,
               splits.parent / f".{splits.name}.forget-{live}": splits,
               p.parent / f".{p.name}.forget-{live}": p}
    for orphan, real in orphans.items():
        shutil.copy(real, orphan)
    assert main(["forget", "--subject-id", str(other), "--warehouse", str(p), "--no-verify"]) == 0
    capsys.readouterr()
    assert [o.name for o in orphans if o.exists()] == []
    assert scan(tmp_path, {other}, stays[other]) == []


def test_a_killed_export_leaves_nothing_registered_or_behind(base, tmp_path, capsys):
    """Killed after its files were moved into place but before they were registered: the next
    writing command removes exactly those files (their content is the one it recorded)."""
    p = _site(base, tmp_path, capsys)
    out = tmp_path / "late"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file")
    env = {k: v for k, v in os.environ.items() if k not in (FORGET_KILL_ENV, TRACE_ENV)}
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "export", "--warehouse", str(p), "--out", str(out)],
                       cwd=ROOT, env={**env, FORGET_KILL_ENV: "export.moved"}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert (out / "stays.parquet").exists()  # moved into place, not registered yet
    _, target, other, stays = base
    assert main(["forget", "--subject-id", str(other), "--warehouse", str(p), "--no-verify"]) == 0
    capsys.readouterr()
    assert sorted(f.name for f in out.iterdir()) == ["notes.txt"]
    from pipelines.store.warehouse import read_meta

    assert str(out) not in read_meta(p).get("export_files", "") and str(out) not in read_meta(p).get(
        "export_pending", "")


@pytest.mark.slow
def test_a_kill_at_every_rewrite_step_leaves_no_copy(base, tmp_path, capsys):
    for i, point in enumerate(_points(base, tmp_path, capsys)):
        _kill_then_check(base, tmp_path / f"k{i}", point, capsys)
