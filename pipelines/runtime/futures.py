"""Waiting on task futures, with progress (:func:`gather`), and fixed-size batches (:func:`chunks`)."""
from __future__ import annotations

import sys
from collections.abc import Iterable


def gather(futures: list, desc: str, progress: bool = True) -> list:
    """Results of ``futures`` in submission order, with a progress bar as they complete."""
    from prefect.futures import as_completed
    from tqdm.auto import tqdm

    bar = tqdm(total=len(futures), desc=desc, disable=not progress, file=sys.stderr, leave=False)
    for _ in as_completed(futures):
        bar.update(1)
    bar.close()
    return [f.result() for f in futures]


def chunks(seq: list, size: int) -> Iterable[list]:
    size = max(1, int(size))
    for i in range(0, len(seq), size):
        yield seq[i:i + size]
