"""Deterioration study: the sequence models and their sizes.

:data:`MODELS` (LSTM, GRU, causal softmax attention, causal SV-hybrid attention), the study's size
:data:`DEFAULT_SIZE`, the keys each model reads (:data:`SIZE_KEYS`, so a study task's cache key holds
only its own model's), ``KEY=VALUE`` overrides (:func:`parse_size`) and :func:`make_model`. Training
and scoring: :mod:`evaluation.clinical.deterioration_training`.
"""
from __future__ import annotations

from evaluation.clinical import deterioration as det

MODELS = det.SEQUENCE_MODELS
#: the study's size. The SV gate's chunk is 24 hours - one gate per day of the 96-hour input, fit at
#: 24, 48 and 72 hours, the latest day read by the dense local path - a product decision (issue 36):
#: on the 42,721-stay protocol it scores as chunk 8 did (docs/results/deterioration_42k.json beside
#: docs/results/deterioration_42k_chunk8.json) at a fraction of chunk 8's training cost
#: (docs/results/deterioration_bench_42k.json); ``--size chunk=8`` runs the earlier size
DEFAULT_SIZE = {"hidden": 32, "d_model": 32, "heads": 2, "layers": 1, "chunk": 24, "C": 0.25, "sigma": 2.0,
                "fista_iters": 40}
#: the keys of a size each model reads (:func:`make_model`); a study task's cache key holds only its
#: model's (:func:`model_size`), so changing the SV gate's chunk re-trains SV attention and no peer
SIZE_KEYS: dict[str, tuple[str, ...]] = {
    "lstm": ("hidden",), "gru": ("hidden",), "softmax": ("d_model", "heads", "layers"),
    "sv_attention": ("d_model", "heads", "layers", "chunk", "C", "sigma", "fista_iters")}


def parse_size(items) -> dict:
    """Size overrides from ``KEY=VALUE`` strings: KEY one of :data:`DEFAULT_SIZE`, VALUE of that
    default's type (int or float), positive. Raises ``DeteriorationInputError`` (one line) otherwise."""
    size: dict = {}
    for item in items:
        key, eq, val = str(item).partition("=")
        if not eq or key not in DEFAULT_SIZE:
            raise det.DeteriorationInputError(
                f"size {item!r} is not KEY=VALUE with KEY one of {', '.join(DEFAULT_SIZE)}")
        kind = type(DEFAULT_SIZE[key])
        try:
            v = kind(val)
        except ValueError:
            raise det.DeteriorationInputError(f"size {key}={val!r}: not a {kind.__name__}") from None
        if not 0 < v < float("inf"):
            raise det.DeteriorationInputError(f"size {key}={val!r}: must be positive and finite")
        size[key] = v
    return size


def model_size(name: str, size: dict | None = None) -> dict:
    """The part of ``size`` (over :data:`DEFAULT_SIZE`) that model ``name`` reads; ``{}`` for a
    model that reads none (the LightGBM peer)."""
    full = {**DEFAULT_SIZE, **(size or {})}
    return {k: full[k] for k in SIZE_KEYS.get(name, ())}


def make_model(name: str, n_features: int, max_len: int, size: dict, seed: int | None = None):
    """One of :data:`MODELS`; ``max_len`` = the longest input row. With ``seed``, the weights are
    drawn from a private generator seeded by it (:func:`models.seeding.reset_parameters_`)."""
    import torch

    from models.gru import GRUClassifier
    from models.lstm import LSTMClassifier
    from models.seeding import reset_parameters_
    from models.sequence_classifier import CausalSequenceClassifier

    if name == "lstm":
        model = LSTMClassifier(n_features, hidden=size["hidden"])
    elif name == "gru":
        model = GRUClassifier(n_features, hidden=size["hidden"])
    elif name == "softmax":
        model = CausalSequenceClassifier(n_features, "softmax", d_model=size["d_model"], n_heads=size["heads"],
                                         n_layers=size["layers"], max_len=max_len)
    elif name == "sv_attention":
        model = CausalSequenceClassifier(n_features, "sv_hybrid", d_model=size["d_model"], n_heads=size["heads"],
                                         n_layers=size["layers"], max_len=max_len,
                                         attn_kwargs={"chunk": size["chunk"], "C": size["C"], "sigma": size["sigma"],
                                                      "fista_iters": size["fista_iters"]})
    else:
        raise det.DeteriorationInputError(f"unknown model {name!r}; choose from {MODELS}")
    if seed is not None:
        reset_parameters_(model, torch.Generator().manual_seed(int(seed)))
    return model
