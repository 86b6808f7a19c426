"""kill -9 in the middle of an ingest run (child process): the rerun completes, nothing is
admitted twice and no row is lost — the result equals an uninterrupted run (content hash, one
live token per closed hour). The child ingests four waiting parts as one watermark step (step 2)
in batches of 2 stays; fixed kill points in each stage (inside the staging transaction, after
it, inside a batch after one batch committed, inside and after the finishing transaction) in
the default suite; a random-delay loop behind the slow mark (FORGETFUL_INGEST_KILLS sets its
count)."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from cohort.incremental.replay import make_replay
from pipelines.ingest import KILL_ENV, ingest

ROOT = Path(__file__).resolve().parents[1]
CHILD = ("import sys; from pipelines.ingest import ingest; from pipelines.settings import IngestSettings\n"
         "print('ready', flush=True)\n"
         "ingest(sys.argv[1], 'mimic', sys.argv[2], final=True, settings=IngestSettings(batch_stays=2))\n"
         "print('done', flush=True)")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from cohort.synthetic import generate

    d = tmp_path_factory.mktemp("killsyn")
    generate(d / "mimic", stays=16, seed=9, fmt="parquet")
    root = d / "root"
    return root, make_replay("mimic", d / "mimic", root, d / "parts", 5, align=True, late_every=17)


def _setup(parts, tmp: Path, name: str) -> tuple[Path, Path]:
    """A fresh root (copy) initialised with part 0, with parts 1..4 waiting."""
    src_root, ps = parts
    root = tmp / f"root_{name}"
    shutil.copytree(src_root, root, ignore=shutil.ignore_patterns("chartevents_part*"))
    shutil.copy(ps[0], root / "icu" / ps[0].name)
    wh = tmp / name / "s.duckdb"
    wh.parent.mkdir()
    ingest(wh, "mimic", root, init=True)
    for p in ps[1:]:
        shutil.copy(p, root / "icu" / p.name)
    return wh, root


def _child(wh, root, kill: str | None = None):
    env = os.environ.copy()
    env.pop(KILL_ENV, None)
    if kill:
        env[KILL_ENV] = kill
    err = open(Path(wh).parent / "child.stderr", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-c", CHILD, str(wh), str(root)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=err, text=True)


def _err(wh) -> str:
    return (Path(wh).parent / "child.stderr").read_text()[-2000:]


def _state(wh) -> tuple:
    con = duckdb.connect(str(wh), read_only=True)
    try:
        h = con.execute("SELECT value FROM build_info WHERE key = 'content_hash'").fetchone()
        toks = con.execute("SELECT count(*), count(DISTINCT (stay_id, hour)) FROM ingest_tokens").fetchone()
        rows = con.execute("SELECT count(*) FROM vitals_hourly").fetchone()[0]
        live = con.execute("SELECT coalesce(sum(n_live), 0) FROM ingest_gates").fetchone()[0]
        raw = con.execute("SELECT count(*) FROM ingest_rows").fetchone()[0]
        files = con.execute("SELECT count(*) FROM ingest_files").fetchone()[0]
    finally:
        con.close()
    assert toks[0] == toks[1] == rows == live, "a closed hour must be exactly one live token"
    return (None if h is None else h[0], rows, raw, files)


@pytest.fixture(scope="module")
def reference(parts, tmp_path_factory):
    wh, root = _setup(parts, tmp_path_factory.mktemp("ref"), "ref")
    ingest(wh, "mimic", root, final=True)
    return _state(wh)


# kill point -> part files recorded when killed, and whether the rerun completes a pending step
KILLS = {"2:stage_before_commit": (1, False), "2:staged": (5, True), "2:batch2": (5, True),
         "2:before_commit": (5, True), "2:after_commit": (5, None)}


@pytest.mark.parametrize("kill", sorted(KILLS))
def test_kill_at_fixed_points_then_rerun(parts, reference, tmp_path, kill):
    wh, root = _setup(parts, tmp_path, "k")
    p = _child(wh, root, kill)
    assert p.stdout.readline().strip() == "ready"
    p.wait(timeout=300)
    assert p.returncode == -signal.SIGKILL, _err(wh)
    if kill in ("2:batch2", "2:before_commit"):  # committed stages live in the WAL until the run's checkpoint
        assert Path(str(wh) + ".wal").stat().st_size > 0
    mid = _state(wh)  # every committed stage is consistent: one live token per emitted hour
    n_files, resumes = KILLS[kill]
    assert mid[3] == n_files, (mid, _err(wh))
    if kill == "2:batch2":  # the first batch of 2 stays committed, the rest not yet
        assert 0 < mid[1] < reference[1], (mid, reference)
    r = ingest(wh, "mimic", root, final=True)
    if resumes is None:  # nothing was left to do (a final run with no new file is an empty step)
        assert all(s["stays_updated"] == 0 and not s["resumed"] for s in r["steps"]), r["steps"]
    else:
        assert r["steps"] and r["steps"][0]["resumed"] is resumes, r["steps"]
    assert _state(wh) == reference, (_state(wh), reference, r["steps"])


PARALLEL_CHILD = ("import sys; import pipelines.ingest.gates as ig; from pipelines.ingest import ingest\n"
                  "from pipelines.settings import IngestSettings\n"
                  "ig.PARALLEL_MIN_STAYS = 1\nprint('ready', flush=True)\n"
                  "ingest(sys.argv[1], 'mimic', sys.argv[2], final=True,\n"
                  "       settings=IngestSettings(batch_stays=2, jobs=2))\n")


def test_kill_with_worker_processes_leaves_none_behind(parts, reference, tmp_path):
    """kill -9 of an ingest using worker processes, inside its second batch: the workers (and
    the forkserver they hold) exit by themselves, and the rerun equals the uninterrupted run."""
    import psutil

    wh, root = _setup(parts, tmp_path, "par")
    env = os.environ.copy()
    env[KILL_ENV] = "2:batch2"
    err = open(Path(wh).parent / "child.stderr", "w")  # noqa: SIM115 - closed with the process
    p = subprocess.Popen([sys.executable, "-c", PARALLEL_CHILD, str(wh), str(root)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=err, text=True)
    assert p.stdout.readline().strip() == "ready"
    me = psutil.Process(p.pid)
    helpers: dict[int, psutil.Process] = {}
    while p.poll() is None:  # the forkserver and the workers, seen while they run
        try:
            helpers.update({c.pid: c for c in me.children(recursive=True)})
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    assert p.returncode == -signal.SIGKILL, _err(wh)
    assert len(helpers) >= 2, "the step ran without worker processes"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE
                                              for h in helpers.values()):
        time.sleep(0.2)
    left = [h.pid for h in helpers.values() if h.is_running() and h.status() != psutil.STATUS_ZOMBIE]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"worker processes left behind: {left}"
    r = ingest(wh, "mimic", root, final=True)
    assert r["steps"] and r["steps"][0]["resumed"] is True
    assert _state(wh) == reference


@pytest.mark.slow
def test_kill_at_random_points(parts, reference, tmp_path):
    rng = random.Random(7)
    wh0, root0 = _setup(parts, tmp_path, "timed")
    p = _child(wh0, root0)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    assert p.stdout.readline().strip() == "done"
    p.wait()
    dur = time.perf_counter() - t0
    for i in range(int(os.environ.get("FORGETFUL_INGEST_KILLS", "12"))):
        wh, root = _setup(parts, tmp_path, f"r{i}")
        p = _child(wh, root)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0, dur))
        p.send_signal(signal.SIGKILL)
        p.wait()
        ingest(wh, "mimic", root, final=True)
        assert _state(wh) == reference
