"""kill -9 at random points of ``forget`` and of the pipelines' build: no half state, no residue, a
rerun recovers (slow: ``pytest -m slow tests/test_forget_kill.py``; FORGETFUL_KILLS sets the count).

Each child imports everything, prints ``ready``, then runs the operation; it is killed after a
random delay drawn uniformly over the operation's measured duration. Then:
* the warehouse opens and the ledger verifies (rc 0 of ``receipts verify``);
* the patient is either untouched (killed before the receipt was committed) or, once the next
  command has run, absent everywhere (killed after: the erasure is completed, never refused);
* no ``.forget-PID`` / ``.building-PID`` file or folder remains after that next command.
"""
from __future__ import annotations

import json
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

ROOT = Path(__file__).resolve().parents[1]
KILLS = int(os.environ.get("FORGETFUL_KILLS", "30"))

FORGET = ("import sys; from pipelines.store.forget import forget_subject; import cohort.build, sv_core\n"
          "print('ready', flush=True)\nforget_subject(sys.argv[1], subject_id=int(sys.argv[2]))\n"
          "print('done', flush=True)")
BUILD = ("import sys; from pipelines.flows.clinical_cohort import build_task\n"
         "from pipelines.settings import CohortSettings\nprint('ready', flush=True)\n"
         "build_task.fn('mimic', sys.argv[2], sys.argv[1], CohortSettings(memory_limit='1GB'))\n"
         "print('done', flush=True)")


def _child(code, *args):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=os.environ.copy(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _timed(code, *args) -> float:
    p = _child(code, *args)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    assert p.stdout.readline().strip() == "done", "the operation itself failed"
    p.wait()
    return time.perf_counter() - t0


def _residue(p: Path) -> list[str]:
    return [q.name for q in p.parent.iterdir() if ".forget-" in q.name or ".building-" in q.name]


def _present(p: Path, subject: int) -> int:
    con = duckdb.connect(str(p), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [subject]).fetchone()[0]
    finally:
        con.close()


def _kill_loop(tmp_path, base, code, args_of, check, n=KILLS, seed=0):
    rng = random.Random(seed)
    dur = _timed(code, *args_of(base(tmp_path / "timing")))
    stats = {"kills": 0, "before_commit": 0, "after_commit": 0, "completed_anyway": 0}
    for i in range(n):
        d = tmp_path / f"k{i}"
        args = args_of(base(d))
        p = _child(code, *args)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0, 1.1 * dur))
        p.send_signal(signal.SIGKILL)
        p.wait()
        stats["kills"] += 1
        check(args, stats)
        shutil.rmtree(d, ignore_errors=True)
    return stats, dur


@pytest.mark.slow
def test_kill_forget_anywhere(tmp_path_factory, tmp_path):
    from cohort.synthetic import generate
    from pipelines.flows.clinical_cohort import build_task
    from pipelines.receipts.ledger import Ledger, default_dir
    from pipelines.settings import CohortSettings
    from pipelines.store.keys import Keys
    from pipelines.store.warehouse import Warehouse

    src = tmp_path_factory.mktemp("src") / "mimic"
    generate(src, stays=30, seed=0, fmt="parquet")
    master = tmp_path_factory.mktemp("master") / "warehouse.duckdb"
    build_task.fn("mimic", str(src), str(master), CohortSettings(memory_limit="1GB"))
    con = duckdb.connect(str(master), read_only=True)
    subject = con.execute("SELECT subject_id FROM cohort_stays ORDER BY stay_id LIMIT 1").fetchone()[0]
    con.close()

    def base(d: Path) -> Path:
        d.mkdir(parents=True)
        shutil.copy(master, d / master.name)
        return d / master.name

    def check(args, stats):
        p = Path(args[0])
        led = Ledger(default_dir(p), Keys.load())
        committed = len(led.rows()) == 1
        pending = committed and _present(p, subject) > 0  # killed after the commit, before the swap

        def verify():
            return subprocess.run([sys.executable, "-m", "pipelines.cli", "receipts", "verify", "--warehouse", str(p)],
                                  cwd=ROOT, capture_output=True, text=True)
        out = verify()
        # the chain verifies; a pending erasure is reported as not verified (exit 1) until completed
        assert out.returncode == (1 if pending else 0), out.stderr[-400:]
        if pending:
            assert json.loads(out.stdout.strip().splitlines()[-1])["pending_erasures"] == 1
        with Warehouse.open(p):  # the next command
            pass
        if pending:
            out = verify()
            assert out.returncode == 0, out.stderr[-400:]
        assert not _residue(p), _residue(p)
        if committed:
            stats["after_commit"] += 1
            assert _present(p, subject) == 0
        else:
            stats["before_commit"] += 1
            assert _present(p, subject) > 0
    stats, dur = _kill_loop(tmp_path, base, FORGET, lambda p: (p, subject), check)
    print(json.dumps({"forget": stats, "duration_s": round(dur, 2)}))
    assert stats["kills"] == KILLS


@pytest.mark.slow
def test_kill_build_anywhere(tmp_path_factory, tmp_path):
    from cohort.synthetic import generate
    from pipelines.flows.clinical_cohort import build_task
    from pipelines.settings import CohortSettings
    from pipelines.store.forget import forget_subject
    from pipelines.store.warehouse import Warehouse

    src = tmp_path_factory.mktemp("src") / "mimic"
    generate(src, stays=30, seed=0, fmt="parquet")
    master_dir = tmp_path_factory.mktemp("master")
    master = master_dir / "warehouse.duckdb"
    build_task.fn("mimic", str(src), str(master), CohortSettings(memory_limit="1GB"))
    con = duckdb.connect(str(master), read_only=True)
    subject = con.execute("SELECT subject_id FROM cohort_stays ORDER BY stay_id LIMIT 1").fetchone()[0]
    con.close()
    forget_subject(master, subject_id=subject, verify=False)

    def base(d: Path) -> Path:
        shutil.copytree(master_dir, d)
        from pipelines.receipts.ledger import default_dir
        from pipelines.receipts.logaudit import FILE, anchor_path

        # the copy's signed anchor (anchors are filed by the log's path)
        shutil.copy(anchor_path(default_dir(master) / FILE), anchor_path(default_dir(d / master.name) / FILE))
        return d / master.name

    def check(args, stats):
        p = Path(args[0])
        with Warehouse.open(p):  # the next command: the old or the new warehouse, whole
            pass
        assert not _residue(p), _residue(p)
        assert _present(p, subject) == 0  # never back, whether the build finished or not
        out = subprocess.run([sys.executable, "-m", "pipelines.cli", "receipts", "verify", "--warehouse", str(p)],
                             cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-400:]
    stats, dur = _kill_loop(tmp_path, base, BUILD, lambda p: (p, src), check)
    print(json.dumps({"build": stats, "duration_s": round(dur, 2)}))
    assert stats["kills"] == KILLS
