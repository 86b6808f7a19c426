"""The log asks its witnesses (issue 33, items 3-5) on a real warehouse: ``receipts witness add``,
every new checkpoint cosigned, a full restore of everything refused by the next build, the
operator's fork (backup → grow → restore → accept-rollback → forget another patient) refused by
the witness with 409, a witness that is down never blocking a forget, and the report's ledger
card naming the public-key command. Witnesses run on 127.0.0.1 (a free port) and are stopped.
No Prefect server: the build task's function is called directly, the CLI through ``main``.
"""
from __future__ import annotations

import json
import re
import shutil

import c2sp_verifier as ref
import duckdb
import pytest
from forget_site import build_site, present, sha
from witness_site import Served

from cohort.synthetic import generate
from pipelines.cli import main
from pipelines.errors import WitnessConflictError
from pipelines.receipts.c2sp import Vkey
from pipelines.receipts.ledger import default_dir
from pipelines.store.forget import forget_subject
from pipelines.store.warehouse import Warehouse


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    generate(d / "mimic", stays=24, seed=1, fmt="parquet")
    p = tmp_path_factory.mktemp("built") / "runs" / "warehouse.duckdb"
    build_site(p, d / "mimic")
    con = duckdb.connect(str(p), read_only=True)
    subjects = [r[0] for r in con.execute("SELECT DISTINCT subject_id FROM cohort_stays ORDER BY 1").fetchall()]
    con.close()
    return p, subjects, d / "mimic"


@pytest.fixture
def site(built, tmp_path, monkeypatch):
    """A copy of the built warehouse, its own config folder, a witness of its log (not yet added)."""
    p0, subjects, src = built
    cfg = tmp_path / "config"
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(cfg))
    (tmp_path / "runs").mkdir()
    p = tmp_path / "runs" / p0.name
    shutil.copy(p0, p)
    vk = tmp_path / "log.vkey"
    assert main(["receipts", "public-key", "--format", "vkey", "--out", str(vk), "--warehouse", str(p)]) == 0
    from pipelines.receipts import witness

    wv = witness.init(tmp_path / "witness", "witness.example/w1")
    served = Served(tmp_path / "witness", [Vkey.parse(vk.read_text())])
    url = f"http://127.0.0.1:{served.port}"
    s = {"p": p, "subjects": subjects, "src": src, "cfg": cfg, "vkey": vk, "wvkey": wv.text(), "url": url,
         "served": served, "tmp": tmp_path}
    yield s
    s["served"].stop()


def _add_witness(s, capsys) -> dict:
    rc = main(["receipts", "witness", "add", "--url", s["url"], "--vkey", s["wvkey"], "--warehouse", str(s["p"])])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    return out


def _auditor_verify(s, capsys, *extra) -> tuple[int, str, str]:
    rc = main(["receipts", "verify", "--public-key", str(s["vkey"]), "--warehouse", str(s["p"]),
               "--witness", s["wvkey"], *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_witness_add_and_every_checkpoint_is_cosigned(site, capsys):
    s, (a, b) = site, site["subjects"][:2]
    forget_subject(s["p"], subject_id=a, verify=False)
    out = _add_witness(s, capsys)
    assert out["asked"][0]["status"] == "cosigned" and out["witnesses"][0]["newest_cosigned_size"] == 1
    forget_subject(s["p"], subject_id=b, verify=False)  # the new checkpoint goes to the witness at once
    cp = s["tmp"] / "checkpoint"
    assert main(["receipts", "head", "--format", "checkpoint", "--out", str(cp), "--warehouse", str(s["p"])]) == 0
    text, ok = ref.open_note(cp.read_text(), [ref.parse_vkey(s["vkey"].read_text()), ref.parse_vkey(s["wvkey"])])
    assert ref.checkpoint(text)[1] == 2 and "witness.example/w1" in ok
    for i in (0, 1):
        f = s["tmp"] / f"r{i}.tlog-proof"
        assert main(["receipts", "prove", "--index", str(i), "--format", "tlog-proof", "--out", str(f),
                     "--warehouse", str(s["p"])]) == 0
        r = ref.verify_tlog_proof(f.read_text(), s["vkey"].read_text(), (s["wvkey"],), quorum=1)
        entry = json.loads(r["entry"])  # the leaf: keyed hashes and aggregates, no record-level id
        assert not re.search(r'"(subject_id|stay_id|hadm_id)"', r["entry"].decode())
        assert re.fullmatch(r"[0-9a-f]{64}", entry["subject_id_hash"])
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in entry["payload"]["stay_id_hashes"])
    capsys.readouterr()
    rc, out, _ = _auditor_verify(s, capsys, "--quorum", "1", "--witness-url", s["url"])
    w = json.loads(out)["witnessed"]
    assert rc == 0 and w["cosigned_newest"] == 1 and w["published"] == [1, 2] and w["asked"][0]["status"] == "cosigned"
    assert w["witnesses"]["witness.example/w1"]["lacking"] == []


def test_a_full_restore_is_refused_by_the_next_build(site, capsys):
    """Back up the warehouse, runs folder (ledger inside), an export and the config folder (keys,
    anchors) after forgetting A; forget B; restore all of it. Nothing local remembers B, but the
    witness does: the next build refuses (B stays out), and so does an auditor who asks it."""
    s, (a, b) = site, site["subjects"][:2]
    forget_subject(s["p"], subject_id=a, verify=False)
    _add_witness(s, capsys)
    assert main(["export", "--warehouse", str(s["p"]), "--out", str(s["tmp"] / "exp")]) == 0
    bak = s["tmp"] / "backup"
    for name in ("runs", "exp", "config"):
        shutil.copytree(s["tmp"] / name, bak / name)
    forget_subject(s["p"], subject_id=b, verify=False)
    kept = s["tmp"] / "kept.checkpoint"  # an auditor who keeps the latest checkpoint catches it too
    assert main(["receipts", "head", "--format", "checkpoint", "--out", str(kept), "--warehouse", str(s["p"])]) == 0
    capsys.readouterr()
    assert _auditor_verify(s, capsys, "--head", str(kept))[0] == 0
    for name in ("runs", "exp", "config"):
        shutil.rmtree(s["tmp"] / name)
        shutil.copytree(bak / name, s["tmp"] / name)
    assert present(s["p"], b) > 0  # the restored warehouse holds B again
    before = sha(s["p"])
    with pytest.raises(WitnessConflictError, match="has cosigned 2 receipts of this log, which holds 1"):
        build_site(s["p"], s["src"])
    assert sha(s["p"]) == before
    capsys.readouterr()
    rc = main(["export", "--warehouse", str(s["p"]), "--out", str(s["tmp"] / "exp2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and len(err) == 1 and "WitnessConflictError" in err[0] and not (s["tmp"] / "exp2").exists()
    rc, _, err = _auditor_verify(s, capsys, "--witness-url", s["url"])
    assert rc == 1 and "409" in err
    rc, _, err = _auditor_verify(s, capsys, "--head", str(kept))
    assert rc == 1 and "the kept checkpoint recorded 2" in err
    # recovery: put the newer log back is the only way the witness accepts; (here: remove the
    # witness after accept-rollback) — the auditor who requires it then sees no cosignature
    assert main(["receipts", "witness", "remove", "--vkey", s["wvkey"], "--warehouse", str(s["p"])]) == 0
    build_site(s["p"], s["src"])
    rc, _, err = _auditor_verify(s, capsys, "--witness-url", s["url"])
    assert rc == 1


def test_the_operator_fork_is_refused_by_the_witness_with_409(site, capsys):
    s, (a, b, c) = site, site["subjects"][:3]
    forget_subject(s["p"], subject_id=a, verify=False)
    _add_witness(s, capsys)
    bak = s["tmp"] / "backup"
    led = default_dir(s["p"])
    shutil.copytree(led, bak / "forget-registry")
    shutil.copytree(s["cfg"], bak / "config")
    forget_subject(s["p"], subject_id=b, verify=False)  # the witness cosigns size 2
    for src, dst in ((bak / "forget-registry", led), (bak / "config", s["cfg"])):
        shutil.rmtree(dst)
        shutil.copytree(src, dst)
    capsys.readouterr()
    assert main(["receipts", "accept-rollback", "--warehouse", str(s["p"])]) == 0  # a new receipt 2: a fork
    capsys.readouterr()
    rc = main(["forget", "--subject-id", str(c), "--warehouse", str(s["p"])])
    err = capsys.readouterr().err
    assert rc == 0 and present(s["p"], c) == 0  # the erasure is never blocked ...
    assert "has cosigned another tree of 2 receipts of this log" in err and "HTTP 409" in err  # ... the fork is refused
    state = json.loads((s["tmp"] / "witness" / "state.json").read_text())
    assert [v["size"] for v in state.values()] == [2]  # the witness still holds the tree it cosigned
    with pytest.raises(WitnessConflictError):
        build_site(s["p"], s["src"])
    rc, _, err = _auditor_verify(s, capsys)
    assert rc == 1 and "cosignatures of 0 of the 1 required" in err


def test_a_witness_that_is_down_never_blocks_a_forget(site, capsys):
    s, (a, b) = site, site["subjects"][:2]
    forget_subject(s["p"], subject_id=a, verify=False)
    _add_witness(s, capsys)
    port = s["served"].port
    s["served"].stop()
    rc = main(["forget", "--subject-id", str(b), "--warehouse", str(s["p"])])
    err = capsys.readouterr().err
    assert rc == 0 and present(s["p"], b) == 0 and "unreachable" in err
    rc, _, err = _auditor_verify(s, capsys, "--quorum", "1")
    assert rc == 1 and "{'witness.example/w1': [2]}" in err  # which checkpoint lacks its cosignature
    s["served"] = Served(s["tmp"] / "witness", [Vkey.parse(s["vkey"].read_text())], port=port)  # back up
    with Warehouse.open(s["p"]):  # any writing command fetches the missing cosignature
        pass
    capsys.readouterr()
    rc, out, _ = _auditor_verify(s, capsys)
    assert rc == 0 and json.loads(out)["witnessed"]["witnesses"]["witness.example/w1"]["lacking"] == []


def test_the_ledger_card_shows_the_public_key_command(site, capsys):
    from dashboards.report import write_report

    s = site
    runs = s["p"].parent
    with Warehouse.open(s["p"]) as w:
        w.register_runs_dir(runs)  # as every command with --runs does; a forget then rewrites the card
    forget_subject(s["p"], subject_id=s["subjects"][0], verify=False)
    write_report(runs, runs / "report.html")
    page = (runs / "report.html").read_text()
    m = re.search(r"<code>(forgetful receipts verify --public-key [^<]+)</code>", page)
    assert m, "the ledger card names no public-key command"
    assert "<code>forgetful receipts public-key --out log.pub</code>" in page
    argv = m.group(1).replace("&#34;", '"').split()[1:]
    assert main(["receipts", "public-key", "--out", str(runs.parent / "log.pub"), "--warehouse", str(s["p"])]) == 0
    capsys.readouterr()
    argv[argv.index("log.pub")] = str(runs.parent / "log.pub")
    assert main([*argv, "--warehouse", str(s["p"])]) == 0  # the command works as shown, with no secret
    assert json.loads(capsys.readouterr().out)["mode"] == "public key"
