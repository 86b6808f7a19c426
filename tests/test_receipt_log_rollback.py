"""No rollback (issue 19, item 2 and the ledger/anchor parts of 7): a restored backup of the
forget registry and the config folder fails closed; the recovery paths; keys owner-only and
never beside the data; interrupted appends; proofs through the CLI.

No Prefect server: the build task's function is called directly, the CLI through ``main``.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import duckdb
import pytest
from forget_site import build_site, present, sha

from cohort.synthetic import generate
from pipelines.cli import main
from pipelines.errors import KeyLocationError, LedgerRollbackError
from pipelines.receipts import logaudit, signing
from pipelines.receipts.ledger import Ledger, default_dir
from pipelines.store.forget import forget_subject
from pipelines.store.keys import Keys
from pipelines.store.warehouse import Warehouse


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    generate(d / "mimic", stays=30, seed=0, fmt="parquet")
    return d / "mimic"


@pytest.fixture(scope="module")
def built(src, tmp_path_factory):
    p = tmp_path_factory.mktemp("built") / "runs" / "warehouse.duckdb"
    build_site(p, src)
    con = duckdb.connect(str(p), read_only=True)
    subjects = [r[0] for r in con.execute("SELECT DISTINCT subject_id FROM cohort_stays ORDER BY 1").fetchall()]
    con.close()
    return p, subjects


@pytest.fixture
def site(built, tmp_path, monkeypatch):
    """A copy of the built warehouse with its own, empty config folder (fresh keys)."""
    p0, subjects = built
    cfg = tmp_path / "config"
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(cfg))
    (tmp_path / "runs").mkdir()
    p = tmp_path / "runs" / p0.name
    shutil.copy(p0, p)
    return p, subjects, cfg


def _restore(backup: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(backup, dst)


def _cli(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err


def test_backup_restore_fails_closed_and_the_newer_log_recovers(site, src, tmp_path, capsys):
    p, subjects, cfg = site
    a, b, c = subjects[:3]
    led_dir = default_dir(p)
    forget_subject(p, subject_id=a, verify=False)
    bak = tmp_path / "backup"  # "last night's backup": the registry and the config folder (keys + anchors)
    shutil.copytree(led_dir, bak / "forget-registry")
    shutil.copytree(cfg, bak / "config")
    forget_subject(p, subject_id=b, verify=False)
    pub, kept = tmp_path / "log.pub", tmp_path / "kept.json"
    assert main(["receipts", "public-key", "--out", str(pub)]) == 0
    assert main(["receipts", "head", "--out", str(kept), "--warehouse", str(p)]) == 0
    shutil.copytree(led_dir, tmp_path / "newer")
    assert present(p, b) == 0
    before = sha(p)
    _restore(bak / "forget-registry", led_dir)
    _restore(bak / "config", cfg)
    # every command refuses with one typed line and touches nothing
    with pytest.raises(LedgerRollbackError, match="holds 1 receipts but the warehouse warehouse.duckdb recorded 2"):
        build_site(p, src)
    rc, err = _cli(capsys, "forget", "--subject-id", str(c), "--warehouse", str(p))
    assert rc == 3 and err.strip().startswith("error: LedgerRollbackError") and len(err.strip().splitlines()) == 1
    assert sha(p) == before and present(p, b) == 0 and len(Ledger(led_dir, Keys.load()).rows()) == 1
    rc, err = _cli(capsys, "receipts", "verify", "--warehouse", str(p))
    assert rc == 1 and "LedgerRollbackError" in err
    rc, err = _cli(capsys, "receipts", "verify", "--public-key", str(pub), "--warehouse", str(p))
    assert rc == 1 and "recorded 2" in err
    rc, _ = _cli(capsys, "receipts", "verify", "--public-key", str(pub), "--warehouse", str(p), "--head", str(kept))
    assert rc == 1
    # recovery 1: put the newer log back (any verified copy of it: a newer backup, an auditor's copy)
    _restore(tmp_path / "newer", led_dir)
    assert main(["receipts", "verify", "--public-key", str(pub), "--warehouse", str(p), "--head", str(kept)]) == 0
    build_site(p, src)
    assert present(p, a) == 0 and present(p, b) == 0
    assert main(["receipts", "verify", "--warehouse", str(p)]) == 0


def test_full_restore_is_caught_by_the_kept_head_only(site, src, tmp_path, capsys):
    """Registry, config folder *and* warehouse restored together: nothing local records the lost
    receipt, so a rebuild admits B again; the auditor's kept head is what detects it."""
    p, subjects, cfg = site
    a, b = subjects[:2]
    forget_subject(p, subject_id=a, verify=False)
    bak = tmp_path / "backup"
    shutil.copytree(default_dir(p), bak / "forget-registry")
    shutil.copytree(cfg, bak / "config")
    shutil.copy(p, bak / "warehouse.duckdb")
    forget_subject(p, subject_id=b, verify=False)
    pub, kept = tmp_path / "log.pub", tmp_path / "kept.json"
    assert main(["receipts", "public-key", "--out", str(pub), "--format", "hex"]) == 0
    assert main(["receipts", "head", "--out", str(kept), "--warehouse", str(p)]) == 0
    _restore(bak / "forget-registry", default_dir(p))
    _restore(bak / "config", cfg)
    shutil.copy(bak / "warehouse.duckdb", p)
    build_site(p, src)
    assert present(p, b) > 0  # the documented limit of local records
    assert main(["receipts", "verify", "--public-key", str(pub), "--warehouse", str(p)]) == 0
    rc, err = _cli(capsys, "receipts", "verify", "--public-key", str(pub), "--warehouse", str(p), "--head", str(kept))
    assert rc == 1 and "the kept head recorded 2" in err


def test_accept_rollback_then_forget_again(site, src, tmp_path, capsys):
    """Recovery 2 when no newer log exists: accept the rollback on the record (a receipt says so),
    forget the lost patient again; the auditor's kept head shows the fork."""
    p, subjects, cfg = site
    a, b = subjects[:2]
    forget_subject(p, subject_id=a, verify=False)
    bak = tmp_path / "backup"
    shutil.copytree(default_dir(p), bak / "forget-registry")
    shutil.copytree(cfg, bak / "config")
    forget_subject(p, subject_id=b, verify=False)
    pub, kept = tmp_path / "log.pub", tmp_path / "kept.json"
    assert main(["receipts", "public-key", "--out", str(pub)]) == 0
    assert main(["receipts", "head", "--out", str(kept), "--warehouse", str(p)]) == 0
    _restore(bak / "forget-registry", default_dir(p))  # the registry only: the anchor still records 2
    with pytest.raises(LedgerRollbackError):
        Ledger(default_dir(p), Keys.load()).verify()
    before = sha(p)
    rc, err = _cli(capsys, "receipts", "accept-rollback", "--warehouse", str(p))
    assert rc == 0 and "forget each again" in err
    assert present(p, b) == 0 and sha(p) != before  # rows untouched; only the record changed
    rows = Ledger(default_dir(p), Keys.load()).rows()
    assert [r.kind for r in rows] == ["forget_subject", "rollback_accepted"]
    assert rows[1].payload["recorded_size"] == 2 and rows[1].payload["log_size"] == 1
    assert main(["receipts", "accept-rollback", "--warehouse", str(p)]) == 0  # nothing left to accept
    assert len(Ledger(default_dir(p), Keys.load()).rows()) == 2
    forget_subject(p, subject_id=b, verify=False, allow_absent=True)
    build_site(p, src)
    assert present(p, a) == 0 and present(p, b) == 0
    assert main(["receipts", "verify", "--public-key", str(pub), "--warehouse", str(p)]) == 0
    assert main(["receipts", "verify", "--warehouse", str(p)]) == 0
    rc, err = _cli(capsys, "receipts", "verify", "--public-key", str(pub), "--head", str(kept), "--warehouse", str(p))
    assert rc == 1 and "do not hash to the root the kept head recorded" in err


def test_interrupted_append_is_signed_by_the_next_command(site, monkeypatch, tmp_path, capsys):
    p, subjects, cfg = site
    forget_subject(p, subject_id=subjects[0], verify=False)
    orig, calls = Ledger._sign_tail, {"n": 0}

    def killed_after_the_row(self, st):
        calls["n"] += 1
        if calls["n"] == 2:  # the row is durable, its head not yet signed
            raise KeyboardInterrupt("killed")
        return orig(self, st)
    monkeypatch.setattr(Ledger, "_sign_tail", killed_after_the_row)
    with pytest.raises(KeyboardInterrupt):
        forget_subject(p, subject_id=subjects[1], verify=False)
    monkeypatch.undo()
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(cfg))
    pub = tmp_path / "log.pub"
    assert main(["receipts", "public-key", "--out", str(pub)]) == 0
    led = default_dir(p)
    assert len(logaudit.read_rows(led / logaudit.FILE)) == 2 and len(logaudit.read_heads(led / logaudit.HEADS)) == 1
    rc, err = _cli(capsys, "receipts", "verify", "--public-key", str(pub), "--ledger", str(led), "--warehouse", str(p))
    assert rc == 1 and "no signed tree head" in err  # an auditor cannot tell it from a forged row
    with Warehouse.open(p):  # the operator's next command signs it (and completes the erasure)
        pass
    assert main(["receipts", "verify", "--public-key", str(pub), "--warehouse", str(p), "--all-signatures"]) == 0
    assert present(p, subjects[1]) == 0


def test_keys_and_anchors_are_owner_only(site):
    p, subjects, cfg = site
    forget_subject(p, subject_id=subjects[0], verify=False)
    led = Ledger(default_dir(p), Keys.load())
    for f in (cfg / "ledger.key", cfg / "signing.key", logaudit.anchor_path(led.path), led.path, led.heads_path):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    for d in (cfg, cfg / "anchors", led.dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert not [f for f in p.parent.rglob("*") if "key" in f.name]  # nothing key-like beside the data


def test_key_files_beside_the_data_are_refused(site, monkeypatch, tmp_path, capsys):
    p, subjects, cfg = site
    forget_subject(p, subject_id=subjects[0], verify=False)
    near = p.parent / "ledger.key"
    shutil.copy(cfg / "ledger.key", near)
    near.chmod(0o600)
    monkeypatch.setenv("FORGETFUL_KEY_FILE", str(near))
    with pytest.raises(KeyLocationError, match="beside the warehouse"):
        with Warehouse.open(p):
            pass
    rc, err = _cli(capsys, "forget", "--subject-id", str(subjects[1]), "--warehouse", str(p))
    assert rc == 3 and "KeyLocationError" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("FORGETFUL_ALLOW_KEY_NEAR_DATA", "1")  # the explicit flag
    with Warehouse.open(p):
        pass
    monkeypatch.delenv("FORGETFUL_ALLOW_KEY_NEAR_DATA")
    monkeypatch.delenv("FORGETFUL_KEY_FILE")
    inside = default_dir(p) / "keys" / "signing.key"
    inside.parent.mkdir()
    shutil.copy(cfg / "signing.key", inside)
    monkeypatch.setenv("FORGETFUL_SIGNING_KEY_FILE", str(inside))
    with pytest.raises(KeyLocationError, match="inside the data folder"):
        forget_subject(p, subject_id=subjects[1], verify=False)
    assert present(p, subjects[1]) > 0


def test_swapped_keys_are_a_verification_failure(site, monkeypatch, capsys):
    p, subjects, cfg = site
    forget_subject(p, subject_id=subjects[0], verify=False)
    monkeypatch.setenv("FORGETFUL_LEDGER_KEY", "z" * 64)
    rc, err = _cli(capsys, "receipts", "verify", "--warehouse", str(p))
    assert rc == 1 and "LedgerKeyMismatchError" in err
    monkeypatch.delenv("FORGETFUL_LEDGER_KEY")
    (cfg / "signing.key").unlink()  # another signing key in its place
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())
    fd = os.open(cfg / "signing.key", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, pem)
    os.close(fd)
    rc, err = _cli(capsys, "receipts", "verify", "--warehouse", str(p))
    assert rc == 1 and "another key" in err


def test_prove_and_verify_proof_offline(site, tmp_path, capsys):
    p, subjects, cfg = site
    for s in subjects[:3]:
        forget_subject(p, subject_id=s, verify=False, allow_absent=True)
    pub, kept = tmp_path / "log.pub", tmp_path / "kept.json"
    assert main(["receipts", "public-key", "--out", str(pub)]) == 0
    assert main(["receipts", "head", "--out", str(kept), "--warehouse", str(p)]) == 0
    forget_subject(p, subject_id=subjects[3], verify=False)
    for seq in (1, 2, 3, 4):
        f = tmp_path / f"incl{seq}.json"
        assert main(["receipts", "prove", "--seq", str(seq), "--out", str(f), "--warehouse", str(p)]) == 0
        assert main(["receipts", "verify-proof", "--public-key", str(pub), str(f)]) == 0
    cons = tmp_path / "cons.json"
    assert main(["receipts", "prove", "--since", str(kept), "--out", str(cons), "--public-key", str(pub),
                 "--warehouse", str(p)]) == 0
    assert main(["receipts", "verify-proof", "--public-key", str(pub), str(cons)]) == 0
    capsys.readouterr()
    good = json.loads((tmp_path / "incl2.json").read_text())
    other = tmp_path / "other.pub"
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other.write_text(signing.public_key_text(Ed25519PrivateKey.generate(), "hex"))
    bad_cases = {
        "edited receipt": {**good, "leaf": good["leaf"].replace('"certified":', '"certified" :', 1)},
        "edited path": {**good, "audit_path": ["00" * 32] + good["audit_path"][1:]},
        "other leaf index": {**good, "leaf_index": 0},
        "other tree size": {**good, "tree_size": 3},
        "forged head": {**good, "sth": {**good["sth"], "root_hash": "00" * 32}},
    }
    cj = json.loads(cons.read_text())
    bad_cases["consistency from a forged head"] = {**cj, "first": {**cj["first"], "root_hash": "11" * 32}}
    bad_cases["consistency with an edited proof"] = {**cj, "proof": ["22" * 32] + cj["proof"][1:]}
    for name, d in bad_cases.items():
        f = tmp_path / "bad.json"
        f.write_text(json.dumps(d))
        rc, err = _cli(capsys, "receipts", "verify-proof", "--public-key", str(pub), str(f))
        assert rc == 1 and "Traceback" not in err, name
    rc, _ = _cli(capsys, "receipts", "verify-proof", "--public-key", str(other), str(tmp_path / "incl2.json"))
    assert rc == 1
    rc, _ = _cli(capsys, "receipts", "prove", "--seq", "9", "--out", str(tmp_path / "x.json"), "--warehouse", str(p))
    assert rc == 2 and not (tmp_path / "x.json").exists()


def test_a_failed_append_leaves_no_half_line(tmp_path, monkeypatch):
    """A short write (disk full) is cut back off: the log stays whole and verifiable."""
    import pipelines.receipts.ledger as lm

    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(tmp_path / "config"))
    led = Ledger(tmp_path / "ledger", Keys.load())
    led.append("forget_subject", "0" * 64, {"n_stays": 1})
    before = led.path.read_bytes(), led.heads_path.read_bytes()
    real = os.write
    monkeypatch.setattr(lm.os, "write", lambda fd, data: real(fd, data[: len(data) // 2]))
    with pytest.raises(OSError, match="short write"):
        led.append("forget_subject", "1" * 64, {"n_stays": 2})
    monkeypatch.setattr(lm.os, "write", real)
    assert (led.path.read_bytes(), led.heads_path.read_bytes()) == before
    assert Ledger(tmp_path / "ledger", Keys.load()).verify()["n_rows"] == 1
