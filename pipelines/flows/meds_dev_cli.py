"""``forgetful meds-dev train|predict``: the project's models as MEDS-DEV entries (docs/meds_dev/).

MEDS-DEV runs a model by the shell text of its ``model.yaml``, with ``{dataset_dir}`` (a MEDS
dataset), ``{labels_dir}`` (the ACES labels of a binary task), ``{output_dir}``, ``{split}`` and
``{demo}`` substituted. These two commands are that text's target::

    forgetful meds-dev train --model gru --dataset-dir D --labels-dir L --output-dir O/train [--seed 0]
    forgetful meds-dev predict --model-dir O/train --dataset-dir D --labels-dir L --output-dir O/predict \
        --split held_out

``train`` fits a model on the ``train`` label rows (each row's hourly stream from the events up to
its prediction time only) and early-stops it on ``tuning``; ``predict`` writes
``predictions.parquet`` for exactly the label rows of ``--split``, the schema meds-evaluation
validates. Models: ``sv_attention``, ``lstm``, ``gru``, ``softmax`` (torch: the ``models`` extra)
and ``lightgbm`` (the ``lightgbm`` extra); a missing extra is one line, exit 3, before anything is
read. Files are owner-only and written atomically; a training folder that already holds a model
is refused unless ``--overwrite``. ``predictions.parquet`` is record-level data (subject ids,
times): keep it where the dataset may be kept. No Prefect server is started.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from pipelines import jsonout
from pipelines.preflight import MEDS_DEV_MODELS
from pipelines.runtime import runner
from pipelines.store.safe_io import replace_private

MODEL_JSON = "model.json"
PREDICTIONS = "predictions.parquet"


def _bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _clear_stale(folder: Path, name: str) -> None:
    """Temporary files a killed run of ours left beside ``name`` (they may hold record-level data)."""
    for f in folder.glob(f".{name}.tmp*"):  # replace_private's temporaries
        if f.is_file() and not f.is_symlink():
            f.unlink(missing_ok=True)


def _streams(args, split: str, lookback: int):
    from cohort.meds_streams import hourly_streams, read_labels, split_subjects

    labels = read_labels(args.labels_dir, split_subjects(args.dataset_dir, split))
    return labels, hourly_streams(args.dataset_dir, labels, lookback, args.meds_codes)


def train(args) -> dict:
    """``forgetful meds-dev train``: read the label rows of the ``train`` and ``tuning`` subjects,
    build each row's hourly stream from the events up to its prediction time only
    (:mod:`cohort.meds_streams`), fit the model on ``train`` and early-stop it on ``tuning``
    (:mod:`evaluation.clinical.meds_dev`; deterministic for ``--seed``), and write ``model.json`` (what
    the model is, the training rows' statistics, facts; no record) and its weights (``weights.npz`` or
    LightGBM's ``booster.txt``; no pickle), each through a temporary file renamed into place, so a
    kill leaves either the old state or the new one.
    """
    from evaluation.clinical import meds_dev as md
    from pipelines.errors import UsageError

    if args.model is None:
        raise UsageError("train needs --model (one of " + ", ".join(MEDS_DEV_MODELS) + ")")
    for flag, v in (("--lookback", args.lookback), ("--max-epochs", args.max_epochs)):
        if v is not None and v < 1:
            raise UsageError(f"{flag} must be at least 1, got {v}")
    out = Path(args.output_dir)
    if (out / MODEL_JSON).exists() and not args.overwrite:
        from cohort.errors import BadParameterError

        raise BadParameterError(f"{out} already holds a trained model ({MODEL_JSON}); choose another --output-dir "
                                "or pass --overwrite")
    t0 = time.perf_counter()
    lab_tr, raw_tr = _streams(args, "train", args.lookback)
    lab_tu, raw_tu = _streams(args, "tuning", args.lookback)
    fitted = md.train(args.model, raw_tr, lab_tr["boolean_value"].to_numpy(), raw_tu,
                      lab_tu["boolean_value"].to_numpy(), seed=args.seed, demo=args.demo,
                      max_epochs=args.max_epochs, device=args.device)
    meta, blobs = fitted.to_files()
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, data in blobs.items():
        _clear_stale(out, name)
        replace_private(out / name, data)
        meta.setdefault("files", {})[name] = hashlib.sha256(data).hexdigest()
    meta.update(train_rows=int(lab_tr.height), tuning_rows=int(lab_tu.height), demo=bool(args.demo),
                meds_codes=_codes_digest(args.meds_codes), created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                forgetful=_version())
    replace_private(out / MODEL_JSON, json.dumps(meta, indent=1, default=float).encode())
    return {"command": "train", "model": args.model, "seed": args.seed, "train_rows": meta["train_rows"],
            "tuning_rows": meta["tuning_rows"], "epochs": meta["facts"]["epochs"],
            "best_tuning_loss": meta["facts"]["best_val_loss"], "seconds": time.perf_counter() - t0,
            "output_dir": str(out)}


def load_trained(folder: Path, device: str = "cpu"):
    """The trained model of a ``train`` output folder, its weights checked against ``model.json``."""
    from evaluation.clinical import meds_dev as md

    try:
        meta = json.loads((folder / MODEL_JSON).read_text())
    except FileNotFoundError:
        raise md.MedsDevInputError(f"--model-dir {folder}: no {MODEL_JSON}; run `forgetful meds-dev train` "
                                   "into it first") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise md.MedsDevInputError(f"--model-dir {folder}: {MODEL_JSON} is not readable JSON "
                                   f"({type(exc).__name__})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        raise md.MedsDevInputError(f"--model-dir {folder}: {MODEL_JSON} lists no weights; train again")
    blobs = {}
    for name, digest in meta["files"].items():
        try:
            data = (folder / Path(name).name).read_bytes()
        except FileNotFoundError:
            raise md.MedsDevInputError(f"--model-dir {folder}: {Path(name).name} is missing; train again") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise md.MedsDevInputError(f"--model-dir {folder}: {name} does not match {MODEL_JSON} (changed or "
                                       "partly written); train again")
        blobs[name] = data
    try:
        return md.Trained.from_files(meta, blobs, device), meta
    except md.MedsDevInputError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise md.MedsDevInputError(f"--model-dir {folder}: {MODEL_JSON} does not describe a trained model "
                                   f"({type(exc).__name__}); train again") from None


def predict(args) -> dict:
    """``forgetful meds-dev predict``: ``predictions.parquet`` for exactly the label rows of
    ``--split``, in their order: ``subject_id``, ``prediction_time``, ``boolean_value`` (as given),
    ``predicted_boolean_probability`` (float32) and ``predicted_boolean_value`` (probability ≥ 0.5).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from evaluation.clinical import meds_dev as md
    from pipelines.errors import UsageError

    if args.model_dir is None or args.split is None:
        raise UsageError("predict needs --model-dir (a train output folder) and --split")
    t0 = time.perf_counter()
    fitted, meta = load_trained(Path(args.model_dir), args.device)
    if args.model is not None and args.model != fitted.model:
        raise md.MedsDevInputError(f"--model {args.model} but {args.model_dir} holds a {fitted.model} model")
    if _codes_digest(args.meds_codes) != meta.get("meds_codes"):
        raise md.MedsDevInputError("--meds-codes differs from the code map the model was trained with")
    labels, raw = _streams(args, args.split, fitted.lookback)
    if labels.height == 0:
        raise md.MedsDevInputError(f"the labels hold no row of a {args.split} subject; nothing to predict")
    p = fitted.predict_proba(raw)
    table = pa.table({
        "subject_id": pa.array(labels["subject_id"].to_numpy(), pa.int64()),
        "prediction_time": labels["prediction_time"].to_arrow().cast(pa.timestamp("us")),
        "boolean_value": labels["boolean_value"].to_arrow().cast(pa.bool_()),
        "predicted_boolean_value": pa.array(p >= md.THRESHOLD, pa.bool_()),
        "predicted_boolean_probability": pa.array(np.asarray(p, np.float32), pa.float32()),
    })
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    _clear_stale(out, PREDICTIONS)
    replace_private(out / PREDICTIONS, sink.getvalue().to_pybytes())
    return {"command": "predict", "model": fitted.model, "split": args.split, "rows": int(table.num_rows),
            "positive_rate_predicted": float(np.mean(p >= md.THRESHOLD)) if p.size else None,
            "seconds": time.perf_counter() - t0, "predictions": str(out / PREDICTIONS)}


def _codes_digest(spec) -> str | None:
    if spec is None:
        return None
    from cohort.meds import load_code_map

    return load_code_map(spec).digest()


def _version() -> str:
    from sv_core._version import __version__

    return __version__


@runner.cli_errors
def _main(args) -> int:
    from pipelines.errors import UsageError
    from pipelines.store.safe_io import storage_errors

    try:
        with storage_errors(f"meds-dev {args.action}: writing {args.output_dir}",
                            "the files already there are unchanged (each is replaced whole or not at all)"):
            r = train(args) if args.action == "train" else predict(args)
    except UsageError as exc:
        print(f"forgetful meds-dev: error: {exc}", file=sys.stderr)
        return 2
    if args.action == "train":
        print(f"meds-dev train: {r['model']} seed {r['seed']} on {r['train_rows']:,} train rows, selected on "
              f"{r['tuning_rows']:,} tuning rows ({r['epochs']} epochs/rounds), {r['seconds']:.1f} s -> "
              f"{r['output_dir']}", file=sys.stderr)
    else:
        print(f"meds-dev predict: {r['model']} on {r['rows']:,} {r['split']} label rows, {r['seconds']:.1f} s -> "
              f"{r['predictions']} (record-level, owner-only)", file=sys.stderr)
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("meds-dev", help="MEDS-DEV entries: train on a MEDS dataset's ACES labels, predict a split",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["train", "predict"], help="train on train/tuning, or predict one split")
    p.add_argument("--model", choices=MEDS_DEV_MODELS, default=None,
                   help="the model to train (predict: optional, checked against --model-dir)")
    p.add_argument("--model-dir", default=None, help="predict: the folder `meds-dev train` wrote")
    p.add_argument("--dataset-dir", required=True, help="the MEDS dataset (data/, metadata/)")
    p.add_argument("--labels-dir", required=True, help="the task's labels (ACES output: *.parquet)")
    p.add_argument("--output-dir", required=True,
                   help="train: the model folder; predict: where predictions.parquet goes")
    p.add_argument("--split", default=None, choices=["train", "tuning", "held_out"], help="predict: the split")
    p.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    p.add_argument("--demo", type=_bool, default=False, metavar="BOOL",
                   help="MEDS-DEV's demo flag: at most 3 epochs (default false)")
    p.add_argument("--lookback", type=int, default=48, help="hours of each stream, ending at its prediction time")
    p.add_argument("--max-epochs", type=int, default=None, help="epoch cap (default 12, or 3 with --demo true)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="torch device (default cpu)")
    p.add_argument("--meds-codes", default=None, metavar="FILE",
                   help="code map JSON, as for build-cohort --source meds (default: this project's export codes "
                        "and MIMIC_IV_MEDS' LAB//<itemid>//<unit>)")
    p.add_argument("--overwrite", action="store_true", help="train: replace a model already in --output-dir")
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
