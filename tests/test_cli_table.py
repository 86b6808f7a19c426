"""The lazy command table of ``forgetful`` equals what the flow modules register, and help needs
no heavy import."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pipelines.cli import COMMANDS, build_parser


def _registered() -> dict[str, str]:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sp.prog for name, sp in sub.choices.items()}


def test_table_matches_the_modules():
    assert set(_registered()) == set(COMMANDS)
    for name, (_mod, help_) in COMMANDS.items():
        assert help_ and name in build_parser([name]).format_help()


def test_help_and_forget_import_neither_torch_nor_prefect():
    code = ("import sys\nfrom pipelines.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "import pipelines.flows.forget_cli, pipelines.store.forget, pipelines.flows.receipts_cli\n"
            "print('torch' in sys.modules, 'prefect' in sys.modules)")
    for argv in (["--help"], ["forget", "--help"], ["receipts", "verify", "--help"]):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1])
        assert out.stdout.strip().splitlines()[-1] == "False False", (argv, out.stdout[-300:], out.stderr[-500:])


def test_unknown_command_is_a_usage_error(capsys):
    import pytest

    from pipelines.cli import main

    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_version_and_exit_codes(capsys, tmp_path):
    import pytest

    from pipelines.cli import main
    from sv_core import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and __version__ in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["forget"])  # usage: --subject-id or --stay-id is required
    assert e.value.code == 2
    capsys.readouterr()
    assert main(["-q", "forget", "--subject-id", "1", "--warehouse", str(tmp_path / "none.duckdb")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: WarehouseMissingError")
