"""Deterioration study: reproducible training on streamed windows, scoring.

LSTM, GRU, causal softmax attention and causal SV-hybrid attention (:data:`MODELS`, built at a size by
:mod:`evaluation.clinical.deterioration_models`), trained on
``train`` (AdamW, BCE on scored hours, positive-class weight), early-stopped on ``val`` BCE, and
scored on ``test`` (per-seed AUROC/AUPRC with a stay-clustered bootstrap; the test predictions
are returned for the paired evaluation). Protocol: :mod:`evaluation.clinical.deterioration`;
reading the warehouse: :mod:`evaluation.clinical.deterioration_reader`. The LightGBM peer on
causal summary features of the same rows: :mod:`evaluation.clinical.tabular_peers`. The training
loop (:func:`fit`) reads rows through a :class:`WindowReader` (bounded memory: one shard at a
time), within the caps of :data:`CAPS`, reproducibly (:func:`deterministic_torch`).
"""
from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from evaluation.clinical import deterioration as det
from evaluation.clinical import deterioration_reader as rd
from evaluation.clinical.deterioration_models import (  # noqa: F401 (re-exported: the study's names)
    DEFAULT_SIZE,
    MODELS,
    SIZE_KEYS,
    make_model,
    model_size,
    parse_size,
)

#: default caps per device; ``None`` = no cap. ``train_windows`` windows drawn afresh each epoch
#: (seeded), a fixed sample of ``val_windows`` validation windows, a fixed sample of ``test_stays``
#: test stays (all their hours), at most ``max_epochs`` epochs, ``seeds`` seeds; the LightGBM peer
#: fits once on ``tabular_windows`` training windows drawn with its seed (held in memory)
CAPS: dict[str, dict[str, int | None]] = {
    "cpu": {"train_windows": 4096, "val_windows": 1024, "test_stays": 1000, "max_epochs": 12, "seeds": 3,
            "tabular_windows": 16384},
    "cuda": {"train_windows": 65536, "val_windows": 8192, "test_stays": None, "max_epochs": 12, "seeds": 3,
             "tabular_windows": None},
}
DEVICES = tuple(CAPS)
TRAINING = "deterministic/v1"  # seeded generator init, deterministic algorithms, 1 CPU thread


def caps_text(device: str) -> str:
    """One line stating the default caps of ``device``."""
    c = CAPS[device]

    def n(v):
        return "all" if v is None else f"{v:,}"

    return (f"{device}: {n(c['train_windows'])} training windows per epoch, {n(c['val_windows'])} validation windows, "
            f"{n(c['test_stays'])} test stays, {c['max_epochs']} epochs, {c['seeds']} seeds; LightGBM: "
            f"{n(c['tabular_windows'])} training windows")


# --------------------------------------------------------------------------------------------
# the study's data (indexes only) and models
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StudyData:
    """What every model × seed reads: the warehouse, feature statistics, the label, the train
    index (all windows) and the capped val / test indexes; ``max_len`` = the longest row of the
    full splits (the attention models' hour embeddings)."""

    warehouse: str
    stats: dict
    label: str
    train: rd.SplitIndex
    val: rd.SplitIndex
    test: rd.SplitIndex
    max_len: int

    def train_positive_rate(self, shard: int = rd.SHARD_WINDOWS) -> float:
        """:func:`positive_rate` of every training window (read ``shard`` windows at a time), read
        once per ``StudyData``: every fit of it weighs the classes by it, and a bench times many fits
        of one. The rate is a ratio of integer counts, so the shard size never changes it."""
        got = self.__dict__.get("_train_positive_rate")
        if got is None:  # frozen: kept beside the fields, as functools.cached_property keeps its value
            got = self.__dict__["_train_positive_rate"] = positive_rate(WindowReader(self, self.train, shard))
        return got


def study_data(warehouse: str, mode: str = "sliding", window: int = 48, context: int = 48, label: str = "filled",
               val_windows: int | None = None, test_stays: int | None = None) -> StudyData:
    """Indexes of the three splits (val / test sampled to the caps with seed 0: the same hours for
    every model and seed)."""
    if label not in det.LABEL_VARIANTS:
        raise det.DeteriorationInputError(f"unknown label {label!r}; choose from {det.LABEL_VARIANTS}")
    with rd.connect(warehouse) as con:
        idx = {s: rd.split_index(con, s, mode, window, context) for s in ("train", "val", "test")}
    max_len = max(window, *(i.longest for i in idx.values()))
    return StudyData(str(warehouse), rd.feature_stats(warehouse), label, idx["train"],
                     idx["val"].sample_windows(val_windows), idx["test"].sample_stays(test_stays), max_len)


_DET_LOCK = threading.Lock()
_DET_USERS = [0, False]  # active trainings, the deterministic mode found before the first


@contextlib.contextmanager
def deterministic_torch(device: str = "cpu", threads: int = 1) -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)`` while any training is inside (reference
    counted across threads; the previous mode comes back after the last), ``threads`` intra-op
    threads on CPU (default one, the study's mode: the reduction order does not depend on the core
    count; process-wide, left set), ``CUBLAS_WORKSPACE_CONFIG`` and cuDNN determinism on CUDA.

    Same seed, same data, same device → same predictions and figures. Initial weights come from a
    private ``torch.Generator`` seeded by the seed (:func:`models.seeding.reset_parameters_`), never
    from the process-wide generator that concurrently training threads share; shuffling and sampling
    use NumPy generators seeded by the seed.
    """
    import torch

    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    else:
        torch.set_num_threads(max(1, int(threads)))
    with _DET_LOCK:
        if _DET_USERS[0] == 0:
            _DET_USERS[1] = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(True)
        _DET_USERS[0] += 1
    try:
        yield
    finally:
        with _DET_LOCK:
            _DET_USERS[0] -= 1
            if _DET_USERS[0] == 0:
                torch.use_deterministic_algorithms(_DET_USERS[1])


# --------------------------------------------------------------------------------------------
# batches, passes
# --------------------------------------------------------------------------------------------
def _batches(d: det.SeqData, batch: int, rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Row batches; rows sorted by length (ties and batch order shuffled when ``rng``) so that each
    batch is trimmed to its own longest row (trailing padding is never read by a causal model)."""
    n = len(d.x)
    length = d.length if d.length is not None else np.full(n, d.x.shape[1])
    key = rng.random(n) if rng is not None else np.zeros(n)
    order = np.lexsort((key, length))
    out = [order[i:i + batch] for i in range(0, n, batch)]
    if rng is not None:
        out = [out[i] for i in rng.permutation(len(out))]
    return out


def _trim(d: det.SeqData, idx: np.ndarray) -> int:
    return int(d.length[idx].max()) if d.length is not None else d.x.shape[1]


class WindowReader:
    """Rows of one split's windows: streamed a shard at a time, or read once and kept when the
    split fits in one shard (the rows and their order are the same either way); or rows already
    in memory (:meth:`of_rows`).

    Every pass streams shards of :data:`~evaluation.clinical.deterioration_reader.SHARD_WINDOWS`
    windows from the warehouse (:func:`~evaluation.clinical.deterioration_reader.iter_shards`): an
    epoch permutes the (capped) training windows, reads them a shard at a time and trains on
    length-sorted batches within the shard; validation and test accumulate a loss sum or the scored
    predictions batch by batch. ``of_rows`` holds the MEDS-DEV entries' rows, one per prediction time.
    """

    def __init__(self, data: StudyData, index: rd.SplitIndex, shard: int):
        self.data, self.index, self.shard = data, index, int(shard)
        self.kept = None
        #: wall seconds :meth:`shards` has spent producing rows (reading and featurising a shard, or
        #: slicing the kept rows), over every pass so far: an epoch's time less this is its compute
        self.read_s = 0.0
        if index.n_windows <= self.shard:
            self.kept = rd.load_windows(data.warehouse, index, np.arange(index.n_windows), data.stats, data.label)

    @classmethod
    def of_rows(cls, rows: det.SeqData, shard: int = rd.SHARD_WINDOWS) -> WindowReader:
        """A reader over rows held in memory (``rows.length`` set), served ``shard`` at a time."""
        self = cls.__new__(cls)
        self.data, self.index, self.shard, self.kept, self.read_s = None, None, int(shard), rows, 0.0
        return self

    @property
    def n_windows(self) -> int:
        return self.index.n_windows if self.index is not None else int(len(self.kept.x))

    def shards(self, order: np.ndarray | None = None) -> Iterator[det.SeqData]:
        """The rows of the windows ``order`` (default all, in index order), ``shard`` windows at a
        time; the time spent producing each is added to :attr:`read_s`."""
        order = np.arange(self.n_windows) if order is None else order
        rows = iter(self._rows(order))
        while True:
            t0 = time.perf_counter()
            try:
                d = next(rows)
            except StopIteration:
                return
            finally:
                self.read_s += time.perf_counter() - t0
            yield d

    def _rows(self, order: np.ndarray) -> Iterator[det.SeqData]:
        if self.kept is None:
            yield from rd.iter_shards(self.data.warehouse, self.index, order, self.data.stats, self.data.label,
                                       self.shard)
            return
        k = self.kept
        for i in range(0, order.size, self.shard):
            o = order[i:i + self.shard]
            yield det.SeqData(k.x[o], k.y[o], k.m[o], k.group[o], None if k.now is None else k.now[o], k.length[o])


def predict(model, reader: WindowReader, device: str = "cpu",
            batch: int = 64) -> Iterator[tuple[det.SeqData, np.ndarray]]:
    """(rows, probabilities (N, T) float32) per shard, in index order (model in eval mode)."""
    import torch

    model.eval()
    with torch.no_grad():
        for d in reader.shards():
            out = np.zeros(d.y.shape, np.float32)
            for idx in _batches(d, batch):
                T = _trim(d, idx)
                x = torch.from_numpy(np.ascontiguousarray(d.x[idx, :T])).to(device)
                out[idx, :T] = torch.sigmoid(model(x)).float().cpu().numpy()
            yield d, out


def mean_bce(model, reader: WindowReader, device: str = "cpu") -> float:
    """Mean BCE over the scored hours (accumulated per shard in float64)."""
    tot, n = 0.0, 0
    for d, p in predict(model, reader, device):
        q = np.clip(p[d.m].astype(np.float64), 1e-7, 1 - 1e-7)
        y = d.y[d.m]
        tot += float(-np.sum(y * np.log(q) + (1 - y) * np.log(1 - q)))
        n += int(y.size)
    return tot / max(n, 1)


def scored_targets(data: StudyData, shard: int = rd.SHARD_WINDOWS) -> dict[str, np.ndarray]:
    """Test labels ``y`` (int8), stay ``groups`` and the event-now baseline ``now`` (float64) at
    the scored hours, in the order of the returned predictions (streamed)."""
    ys, gs, ns = [], [], []
    for d in WindowReader(data, data.test, shard).shards():
        ys.append(d.scored(d.y).astype(np.int8))
        gs.append(d.scored(np.broadcast_to(d.group[:, None], d.m.shape)))
        ns.append(d.scored(d.now).astype(np.float64))
    return {"y": np.concatenate(ys), "groups": np.concatenate(gs), "now": np.concatenate(ns)}


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------
_EPOCH_LISTENERS: list[Callable[[dict], None]] = []


@contextlib.contextmanager
def epoch_progress(listener: Callable[[dict], None] | None) -> Iterator[None]:
    """While inside, :func:`train_and_test` calls ``listener(event)`` in this process after every
    epoch — from the worker thread that trains — with ``model, seed, epoch, max_epochs,
    train_loss, val_loss, elapsed_s, cpu_s, read_s`` (``cpu_s``: this process's CPU seconds since
    training began, all threads; ``read_s``: of ``elapsed_s``, the seconds spent producing rows for the
    training and validation passes, :attr:`WindowReader.read_s`; the rest is the model's compute).
    ``None`` registers nothing."""
    if listener is None:
        yield
        return
    _EPOCH_LISTENERS.append(listener)
    try:
        yield
    finally:
        _EPOCH_LISTENERS.remove(listener)


def emit_epoch(event: dict) -> None:
    """Pass a training-progress event to the listeners of :func:`epoch_progress` (the LightGBM peer
    reports its one fit as one epoch of one)."""
    for fn in list(_EPOCH_LISTENERS):
        fn(event)


def positive_rate(reader: WindowReader) -> float:
    """Share of positive labels among the scored hours of ``reader`` (the class weight's input)."""
    pos = n = 0
    for d in reader.shards():
        pos, n = pos + float(d.y[d.m].sum()), n + int(d.m.sum())
    return pos / max(n, 1)


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise det.DeteriorationInputError(f"unknown device {device!r}; choose from {DEVICES}")


def fit(model_name: str, seed: int, train: WindowReader, val: WindowReader, *, n_features: int, max_len: int,
        size: dict | None = None, max_epochs: int = 12, patience: int = 3, batch: int = 16, lr: float = 3e-3,
        train_windows: int | None = None, device: str = "cpu") -> tuple[Any, dict[str, Any]]:
    """Train one sequence model with one seed (call inside :func:`deterministic_torch`): AdamW,
    BCE on the scored hours with a positive-class weight, ``train_windows`` windows drawn per epoch
    (None = all), early stopping on the mean validation BCE (``patience`` epochs); the best state is
    loaded back. Returns (model, facts: epochs, best_val_loss, train_s, n_params,
    train_windows_per_epoch)."""
    import torch

    size = {**DEFAULT_SIZE, **(size or {})}
    model = make_model(model_name, n_features, max_len, size, seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    pos = train.data.train_positive_rate(train.shard) if train.data is not None and train.index is train.data.train \
        else positive_rate(train)
    pw = torch.tensor((1 - pos) / max(pos, 1e-3), device=device)
    rng = np.random.default_rng(seed)
    W = train.n_windows
    best, best_state, bad, epochs = np.inf, None, 0, 0
    t0, c0, r0 = time.perf_counter(), time.process_time(), train.read_s + val.read_s
    for ep in range(max_epochs):
        model.train()
        losses = []
        pick = np.arange(W) if train_windows is None or train_windows >= W else \
            rng.choice(W, int(train_windows), replace=False)
        for d in train.shards(rng.permutation(pick)):
            for idx in _batches(d, batch, rng):
                T = _trim(d, idx)
                m = torch.from_numpy(np.ascontiguousarray(d.m[idx, :T])).to(device)
                if not bool(m.any()):
                    continue
                x = torch.from_numpy(np.ascontiguousarray(d.x[idx, :T])).to(device)
                y = torch.from_numpy(np.ascontiguousarray(d.y[idx, :T])).to(device)
                logits = model(x)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[m], y[m], pos_weight=pw)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                losses.append(float(loss.detach()))
        epochs = ep + 1
        vl = mean_bce(model, val, device)
        emit_epoch({"model": model_name, "seed": int(seed), "epoch": epochs, "max_epochs": int(max_epochs),
                    "train_loss": float(np.mean(losses)) if losses else float("nan"), "val_loss": vl,
                    "elapsed_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                    "read_s": train.read_s + val.read_s - r0})
        if vl < best - 1e-4:
            best, best_state, bad = vl, copy.deepcopy(model.state_dict()), 0
        else:
            bad += 1
            if bad >= patience:
                break
    train_s = time.perf_counter() - t0
    if best_state is not None:
        model.load_state_dict(best_state)
    return model, {"epochs": epochs, "best_val_loss": float(best), "train_s": train_s,
                   "n_params": int(sum(q.numel() for q in model.parameters())),
                   "train_windows_per_epoch": int(min(W, train_windows or W))}


def scored_predictions(pairs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p float64, y int8, stay groups) at the scored hours of ``(rows, probabilities)`` pairs, in order."""
    ps, ys, gs = [], [], []
    for d, p in pairs:
        ps.append(d.scored(p))
        ys.append(d.scored(d.y).astype(np.int8))
        gs.append(d.scored(np.broadcast_to(d.group[:, None], d.m.shape)))
    return np.concatenate(ps).astype(np.float64), np.concatenate(ys), np.concatenate(gs)


def run_result(model_name: str, seed: int, facts: dict, p: np.ndarray, y: np.ndarray, g: np.ndarray,
               n_boot: int, return_predictions: bool) -> dict[str, Any]:
    """One model × seed's result: its facts, test AUROC/AUPRC with a stay-clustered bootstrap CI
    (seeded by the seed) and, with ``return_predictions``, the float32 test probabilities ``p_test``."""
    from evaluation.cluster_bootstrap import paired_cluster_bootstrap

    b = paired_cluster_bootstrap(y, {"p": p}, g, n_boot=n_boot, seed=seed)
    ci = {**b["scores"]["p"], "prevalence": float(y.mean()),
          **{k: b[k] for k in ("n", "n_pos", "n_boot_used", "n_boot_skipped", "level", "seed", "n_groups")}}
    out = {"model": model_name, "seed": int(seed), **facts, **ci}
    if return_predictions:
        out["p_test"] = p.astype(np.float32)
    return out


def train_and_test(data: StudyData, model_name: str, seed: int, *, size: dict | None = None, max_epochs: int = 12,
                   patience: int = 3, batch: int = 16, lr: float = 3e-3, n_boot: int = 10_000,
                   train_windows: int | None = None, device: str = "cpu", shard: int = rd.SHARD_WINDOWS,
                   return_predictions: bool = False, threads: int = 1) -> dict[str, Any]:
    """Train one model with one seed (:func:`fit`); return test AUROC/AUPRC with a stay-clustered CI,
    training facts and (``return_predictions``) the test probabilities at the scored hours (float32,
    in :func:`scored_targets` order) under ``"p_test"``. ``train_windows``: windows drawn per epoch
    (None = all). ``threads``: CPU intra-op threads (1, the study's deterministic mode; more for
    timing, see :mod:`evaluation.clinical.deterioration_bench`)."""
    check_device(device)
    with deterministic_torch(device, threads):
        train, val = WindowReader(data, data.train, shard), WindowReader(data, data.val, shard)
        model, facts = fit(model_name, seed, train, val, n_features=det.N_FEATURES, max_len=data.max_len, size=size,
                           max_epochs=max_epochs, patience=patience, batch=batch, lr=lr,
                           train_windows=train_windows, device=device)
        p, y, g = scored_predictions(predict(model, WindowReader(data, data.test, shard), device))
    return run_result(model_name, seed, facts, p, y, g, n_boot, return_predictions)
