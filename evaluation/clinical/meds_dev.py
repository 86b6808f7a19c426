"""The MEDS-DEV entries' models: one label per prediction time, its hourly stream as input.

Any MEDS-DEV binary task (ACES label rows) on any MEDS dataset whose numeric codes map to the six
hourly vitals (:mod:`cohort.meds_streams` builds, per row, the ``lookback`` hours ending at its
prediction time). Every model of the deterioration study runs here (:data:`MODELS`): the
sequence models read the row's causal features (:func:`evaluation.clinical.deterioration.causal_features`:
forward fill within the row, the training median before a vital's first value, z-scored with the
training rows' statistics, observed flags) and are scored at the row's last hour, the prediction
time; LightGBM reads the causal summary features of that hour
(:mod:`evaluation.clinical.tabular_peers`). The training loops are the study's
(:func:`evaluation.clinical.deterioration_training.fit`, :func:`evaluation.clinical.tabular_peers.fit`):
trained on the ``train`` rows, early-stopped on the ``tuning`` rows, deterministic for a seed.

A trained model is data, never code: :meth:`Trained.to_files` gives a JSON-able description
(model, seed, lookback, statistics, sizes, facts) and the weights as bytes (a NumPy ``.npz`` of the
torch state, read back with ``allow_pickle=False``, or LightGBM's text model).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evaluation.clinical import deterioration as det
from evaluation.clinical import deterioration_training as dtr

MODELS = det.MODELS
#: the epoch cap of a MEDS-DEV ``demo`` run (a quick pass on a demo dataset)
DEMO_MAX_EPOCHS = 3
#: probability at or above which ``predicted_boolean_value`` is true
THRESHOLD = 0.5
WEIGHTS = {"lightgbm": "booster.txt"}
TORCH_WEIGHTS = "weights.npz"


class MedsDevInputError(det.DeteriorationInputError):
    """A MEDS-DEV task this model cannot be trained or run on (no rows, one class, a model folder
    that does not match)."""


def stream_stats(raw: np.ndarray) -> dict[str, np.ndarray]:
    """mean, sd (ddof 1) and median per vital of the observed hourly values of training streams
    ``raw`` (N, T, V); a vital never observed gets mean 0, sd 1, median 0 (its z-score is then 0
    and its observed flag always 0), a constant one sd 1."""
    V = raw.shape[2]
    mean, sd, med = np.zeros(V), np.ones(V), np.zeros(V)
    for j in range(V):
        v = raw[..., j][~np.isnan(raw[..., j])]
        if v.size:
            mean[j], med[j] = float(v.mean()), float(np.median(v))
            s = float(v.std(ddof=1)) if v.size > 1 else 0.0
            sd[j] = s if s > 0 and np.isfinite(s) else 1.0
    return {"mean": mean, "sd": sd, "median": med}


def rows(raw: np.ndarray, stats: dict, labels: np.ndarray | None = None) -> det.SeqData:
    """Model rows of streams ``raw`` (N, T, V): causal features, the label (``labels`` (N,), 0 when
    None) at the last hour, which is the only scored hour."""
    N, T, _ = raw.shape
    x = det.causal_features(raw, ~np.isnan(raw), stats)
    y = np.zeros((N, T), np.float32)
    m = np.zeros((N, T), bool)
    m[:, -1] = True
    if labels is not None:
        y[:, -1] = np.asarray(labels, dtype=np.float32)
    return det.SeqData(x, y, m, np.arange(N), None, np.full(N, T, np.int64))


@dataclass
class Trained:
    """A fitted model and what it needs to predict: ``net`` a torch module or a LightGBM booster."""

    model: str
    seed: int
    lookback: int
    stats: dict
    size: dict
    facts: dict
    net: Any = field(repr=False)
    device: str = "cpu"

    def predict_proba(self, raw: np.ndarray) -> np.ndarray:
        """(N,) float32 probabilities of streams ``raw`` (N, lookback, V), at their last hour."""
        if raw.shape[1] != self.lookback:
            raise MedsDevInputError(f"streams of {raw.shape[1]} hours; this model reads {self.lookback}")
        if raw.shape[0] == 0:
            return np.zeros(0, np.float32)
        reader = dtr.WindowReader.of_rows(rows(raw, self.stats))
        if self.model in det.TABULAR_MODELS:
            from evaluation.clinical import tabular_peers as tp

            pairs = tp.predict(self.net, reader)
            return dtr.scored_predictions(pairs)[0].astype(np.float32)
        with dtr.deterministic_torch(self.device):
            return dtr.scored_predictions(dtr.predict(self.net, reader, self.device))[0].astype(np.float32)

    def to_files(self) -> tuple[dict, dict[str, bytes]]:
        """(description, {file name: bytes}) — see the module docstring."""
        meta = {"model": self.model, "seed": self.seed, "lookback": self.lookback, "size": self.size,
                "stats": {k: np.asarray(v, dtype=float).tolist() for k, v in self.stats.items()},
                "facts": self.facts, "threshold": THRESHOLD}
        if self.model in det.TABULAR_MODELS:
            return meta, {WEIGHTS[self.model]: self.net.model_to_string().encode()}
        return meta, {TORCH_WEIGHTS: npz_bytes({k: v.detach().cpu().numpy() for k, v in self.net.state_dict().items()})}

    @classmethod
    def from_files(cls, meta: dict, blobs: dict[str, bytes], device: str = "cpu") -> Trained:
        """The inverse of :meth:`to_files` (no pickle: ``allow_pickle=False``, LightGBM's text format)."""
        name = meta.get("model")
        if name not in MODELS:
            raise MedsDevInputError(f"the model folder names no known model ({name!r}); choose from {MODELS}")
        if weights_file(name) not in blobs:
            raise MedsDevInputError(f"the model folder lists no {weights_file(name)}; train again")
        stats = {k: np.asarray(meta["stats"][k], dtype=np.float64) for k in ("mean", "sd", "median")}
        common = dict(model=name, seed=int(meta["seed"]), lookback=int(meta["lookback"]), stats=stats,
                      size=dict(meta.get("size") or {}), facts=dict(meta.get("facts") or {}), device=device)
        if name in det.TABULAR_MODELS:
            from evaluation.clinical import tabular_peers as tp

            lgb = tp.require_lightgbm()
            return cls(net=lgb.Booster(model_str=blobs[WEIGHTS[name]].decode()), **common)
        import torch

        net = dtr.make_model(name, det.N_FEATURES, common["lookback"], {**dtr.DEFAULT_SIZE, **common["size"]})
        with np.load(io.BytesIO(blobs[TORCH_WEIGHTS]), allow_pickle=False) as z:
            net.load_state_dict({k: torch.from_numpy(z[k]) for k in z.files})
        return cls(net=net.to(device).eval(), **common)


def weights_file(model: str) -> str:
    """The weights file of ``model``'s folder."""
    return WEIGHTS.get(model, TORCH_WEIGHTS)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An ``.npz`` archive of ``arrays`` whose bytes depend on the arrays alone (``np.savez`` stamps
    each member with the time of writing), so one seed's weights are one file."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for k, v in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(v), allow_pickle=False)
            z.writestr(zipfile.ZipInfo(f"{k}.npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue())
    return buf.getvalue()


def train(model: str, raw_train: np.ndarray, y_train: np.ndarray, raw_tuning: np.ndarray, y_tuning: np.ndarray, *,
          seed: int = 0, demo: bool = False, size: dict | None = None, max_epochs: int | None = None,
          device: str = "cpu", threads: int = 1) -> Trained:
    """Fit ``model`` on the training streams (N, L, V) and labels (N,), select on the tuning ones
    (early stopping), deterministic for ``seed``. ``max_epochs`` defaults to the study's cap (12;
    :data:`DEMO_MAX_EPOCHS` with ``demo``)."""
    if model not in MODELS:
        raise MedsDevInputError(f"unknown model {model!r}; choose from {MODELS}")
    dtr.check_device(device)
    for what, raw, y in (("train", raw_train, y_train), ("tuning", raw_tuning, y_tuning)):
        if raw.shape[0] == 0:
            raise MedsDevInputError(f"the task has no label row of the {what} split")
        if raw.shape[0] != np.asarray(y).shape[0]:
            raise MedsDevInputError(f"{what}: {raw.shape[0]} streams but {np.asarray(y).shape[0]} labels")
    if np.asarray(y_train).min() == np.asarray(y_train).max():
        raise MedsDevInputError("the train split's labels are all one class; a binary model needs both")
    L = raw_train.shape[1]
    stats = stream_stats(raw_train)
    tr = dtr.WindowReader.of_rows(rows(raw_train, stats, y_train))
    tu = dtr.WindowReader.of_rows(rows(raw_tuning, stats, y_tuning))
    epochs = max_epochs if max_epochs is not None else (DEMO_MAX_EPOCHS if demo else dtr.CAPS[device]["max_epochs"])
    if model in det.TABULAR_MODELS:
        from evaluation.clinical import tabular_peers as tp

        net, facts = tp.fit(seed, tr, tu, threads=threads)
        return Trained(model, int(seed), L, stats, {}, facts, net, device)
    sz = {**dtr.DEFAULT_SIZE, **(size or {})}
    with dtr.deterministic_torch(device, threads):
        net, facts = dtr.fit(model, seed, tr, tu, n_features=det.N_FEATURES, max_len=L, size=sz,
                             max_epochs=int(epochs), device=device)
    return Trained(model, int(seed), L, stats, sz, facts, net.eval(), device)
