"""CLI conventions across every command: each option has help text without raw reStructuredText,
and ``--json PATH`` means the same everywhere (write the machine-readable result to PATH)."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from pipelines.cli import COMMANDS, build_parser, main, plain_text

RST = re.compile(r":(func|class|mod|meth|attr|data|obj|exc|ref):`|``")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command parser, nested ones (``receipts verify``) included, by its prog."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sp in a.choices.values():
                    out[sp.prog] = sp
                    walk(sp)

    walk(build_parser())
    return out


PARSERS = _parsers()


def _progs():
    return sorted(PARSERS)


def test_every_command_is_covered():
    progs = {prog.split()[1] for prog in PARSERS}
    assert progs == set(COMMANDS)


@pytest.mark.parametrize("prog", _progs())
def test_every_option_has_plain_help(prog):
    p = PARSERS[prog]
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = "/".join(a.option_strings) or a.dest
        assert a.help and a.help.strip() and a.help != argparse.SUPPRESS, f"{prog} {name}: no help text"
        assert not RST.search(a.help), f"{prog} {name}: raw RST markup in help: {a.help!r}"
    text = p.format_help()
    assert not RST.search(text), f"{prog}: raw RST markup in --help: {RST.search(text).group(0)!r}"


@pytest.mark.parametrize("prog", _progs())
def test_json_option_takes_a_path(prog):
    p = PARSERS[prog]
    js = [a for a in p._actions if "--json" in a.option_strings]
    if any(isinstance(a, argparse._SubParsersAction) for a in p._actions):
        return  # a group command (receipts): its subcommands carry the option
    assert js, f"{prog}: no --json PATH option"
    (a,) = js
    assert a.nargs is None and a.metavar == "PATH" and a.const is None, f"{prog}: --json is not --json PATH"


def test_plain_text_strips_roles_and_literals():
    assert plain_text("see :func:`sv_core.audit.run_audit` and ``runs/x.json``") == (
        "see sv_core.audit.run_audit and runs/x.json")
    assert plain_text(":class:`Gate <sv_core.Gate>`") == "Gate"


def test_gate_demo_json_path_writes_the_result(tmp_path, capsys):
    out = tmp_path / "sub" / "gate.json"
    assert main(["gate-demo", "--n", "60", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gate: n=60" in printed and '"receipt"' not in printed  # console unchanged: no JSON dump
    d = json.loads(out.read_text())
    assert d["n"] == 60 and d["receipt"]["verification"]["kkt_residual"] < 1e-8
    assert sum(d["partition"].values()) == 60
    # the console prints the receipt itself (README: "prints the receipt"), the same one as the JSON
    r = d["receipt"]
    assert f"receipt: token {r['token_id']} forgotten" in printed and "  certified     yes" in printed
    assert f"refit gap     max |Δ gate score| {r['verification']['max_abs_score_dev']:.2e}" in printed
    assert f"KKT residual  {r['verification']['kkt_residual']:.1e}" in printed
    assert "  fallback      no" in printed and "  verification  passed" in printed
    assert r["status_before"] in ("margin", "error")  # a support key, still held after the eviction
    # without --json nothing is written
    assert main(["gate-demo", "--n", "60"]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["gate.json"]


def test_receipts_json_path_writes_the_verification(tmp_path, capsys):
    from pipelines.receipts.ledger import Ledger
    from pipelines.store.keys import Keys

    led_dir = tmp_path / "ledger"
    led = Ledger(led_dir, Keys.load(create=True))
    led.append("patient", "0" * 64, {"n_stays": 1, "contexts": [], "certified": True, "rows_deleted": {"x": 3}})
    wh = str(tmp_path / "absent.duckdb")
    v, ls = tmp_path / "verify.json", tmp_path / "list.json"
    assert main(["receipts", "verify", "--ledger", str(led_dir), "--warehouse", wh, "--json", str(v)]) == 0
    assert main(["receipts", "list", "--ledger", str(led_dir), "--warehouse", wh, "--json", str(ls)]) == 0
    dv, dl = json.loads(v.read_text()), json.loads(ls.read_text())
    assert dv["chain_verified"] is True and dv["n_rows"] == 1
    assert dl["count"] == 1 and dl["receipts"][0]["rows_deleted"] == {"x": 3}
    assert "0" * 64 not in ls.read_text()  # aggregate fields only, never the subject hash
