"""Seed 002's comparison across acceptance regimes: every verifier and the NDE selector on controlled drafts.

The committed study of ``bench/study.py`` sits at block efficiency 1.1-1.4 (real drafts of SmolLM2-135M);
seed 002's claims were made at 2-6.8. This study places the comparison at chosen single-token acceptances
with the *rank-permuted mixture* draft of :mod:`spec_ref.controlled_draft` (q = (1 - eps) p + eps r, r = p
with its masses moved between the tokens of its support by a seeded permutation of their ranks, built from
the target's own law p at every node, so acceptance 1 - TV(p, q) = 1 - eps TV(p, r) is set by eps). The draft is derived from p and costs a target pass per drafted token: it is a tool for block
efficiency, never a speed claim. Throughput columns use a stated latency model (below), not timing.

Pipeline (SmolLM2-135M-Instruct float32, transformers forward, no engine code):

1. Roots: for each study prompt (``bench/data/study_prompts.json``) the target samples its own response at
   T = 1 (seeded); a root every 16 tokens (``--roots`` per prompt).
2. Target law p at a node: ``softmax(logits / T)``, the nucleus ``top_p``, then the ``--top-k`` (128) most
   probable tokens, renormalised in float64. The top-k keeps every verifier exact on a small vocabulary
   (:func:`bench.regimes_eval.reduce_pair`); the removed mass is reported. Settings (T, top-p): the eight
   settings of ``bench/study.py``.
3. Regimes: target acceptances ``--regimes``; eps per (setting, regime) solves mean root acceptance =
   target over all roots (:func:`spec_ref.controlled_draft.solve_strength`), the achieved value reported.
4. At each (root, setting, regime): one shared draw (:class:`spec_fast.nde.selector_data.DelayedDraws`, K <= 4,
   L1 <= 4, L2 <= 8, so every (K, L1, L2) tree of that action space, depths up to 12) drafted from q with
   target forwards at every node that has draws.
5. Exact E[tau + 1 | tree] on the drawn trees (no Monte Carlo noise): eq. 3 by depth for the OT methods,
   the closed forms for naive and BV on chains (1, 0, L), Traversal's exact depth law on every tree with
   K >= 2 (K = 1: BV's, equal in law); and one Monte Carlo run of :func:`spec_ref.verify` per method on a
   few shapes (the "measured" column).
6. Offline throughput E / T_hat with eq. 11 (spec_ref.selector.latency_estimate): t_p = 1 (a target pass,
   flat in the tree's width, as on a GPU) and t_q = ``--draft-cost`` (0.05) per draft step.
7. NDE: the selector of spec_fast.nde.selector_training (its SelectorNet, loss, training and evaluation
   functions as they are), trained on these rows per OT method and scored out of fold (5-fold
   cross-fitting by prompt), against the best static shape per regime and Traversal's best static shape.
   ``--nde-steps`` (400) is below TrainSettings' 1000 to fit the session's time.

    python bench/study_regimes.py --quick   # CI-sized: tiny random Llama, 5 roots, 2 regimes (~15 s CPU)
    python bench/study_regimes.py           # the committed study: 20 prompts x 1 root, 8 settings, 4 regimes,
                                            # 5 NDE methods
    python bench/study_regimes.py --report-only   # tables, plots and the NDE part from the saved rows
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from typing import Any

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench._git import git_commit  # noqa: E402
from bench.study import SETTINGS as STUDY_SETTINGS  # noqa: E402
from bench.regimes_eval import (  # noqa: E402
    NodeLaw,
    action_draws,
    ot_depth_mass,
    reduce_pair,
    traversal_depth_law,
    tree_of,
)
from spec_fast.nde.selector_data import DelayedDraws  # noqa: E402
from spec_ref.controlled_draft import solve_strength, total_variation, vocab_permutation  # noqa: E402
from spec_ref.efficiency import expected_block_efficiency  # noqa: E402
from spec_ref.rng import GeneratorSource  # noqa: E402
from spec_ref.selector import action_space  # noqa: E402
from spec_ref.verify import verify  # noqa: E402

PROMPTS_PATH = os.path.join(ROOT, "bench", "data", "study_prompts.json")
OUT = os.path.join(ROOT, "bench", "results", "study_regimes")
OT = ("nss", "naive_tree", "spectr", "specinfer", "khisti")
SINGLE = ("naive", "bv")
METHODS = SINGLE + OT + ("traversal",)
#: the sampling settings (T, top-p) of bench/study.py, all eight
SETTINGS = tuple(STUDY_SETTINGS)
REGIMES = (0.3, 0.6, 0.8, 0.95)
K_MAX, L1_MAX, L2_MAX = 4, 4, 8
ACTIONS = action_space(K_MAX, L1_MAX, L2_MAX)
INDEX = {a: i for i, a in enumerate(ACTIONS)}
#: shapes of the Monte Carlo ("measured") runs: chains for the single-path methods, trees for the others
MEASURED = {"chain": (1, 0, 4), "trees": ((2, 0, 4), (4, 0, 4), (4, 2, 4))}
INTERVAL = 16


# ----------------------------------------------------------------------------------------------------
# Target laws and the forward
# ----------------------------------------------------------------------------------------------------
def sampling_law(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> tuple[np.ndarray, float]:
    """``(p [V] float64, removed)``: softmax(logits / T), the nucleus top_p, the top_k tokens, renormalised;
    ``removed`` = the nucleus law's mass outside the top k."""
    z = logits.double().numpy() / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    if top_p < 1.0:
        cum = np.cumsum(p[order])
        keep = int(np.searchsorted(cum, top_p) + 1)
        nucleus = np.zeros_like(p)
        nucleus[order[:keep]] = p[order[:keep]]
        p = nucleus / nucleus.sum()
    out = np.zeros_like(p)
    out[order[:top_k]] = p[order[:top_k]]
    removed = float(1.0 - out.sum())
    return out / out.sum(), removed


class Target:
    """A causal LM with a DynamicCache: prefill a context, then one token per row per step."""

    def __init__(self, model: Any) -> None:
        from spec_fast._hf_compat import cache_keyword

        self.model = model
        self.cache_name = cache_keyword(model.forward)  # "cache" from transformers 5.24, else "past_key_values"

    @torch.no_grad()
    def prefill(self, ids: list[int]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """``(cache, logits [2, V] of the last two positions, hidden [2, H] of them)``."""
        from transformers import DynamicCache

        cache = DynamicCache()
        out = self.model(input_ids=torch.tensor([ids]), use_cache=True, output_hidden_states=True,
                         **{self.cache_name: cache})
        return cache, out.logits[0, -2:].float(), out.hidden_states[-1][0, -2:].float()

    @torch.no_grad()
    def step(self, cache: Any, tokens: list[int], mask: torch.Tensor | None = None,
             positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, V]`` of one new token per row; ``mask [B, cached + 1]`` and ``positions [B, 1]`` for
        rows whose cached prefix has gaps (the batched branches of :func:`shared_draw`)."""
        out = self.model(input_ids=torch.tensor(tokens).view(-1, 1), use_cache=True, attention_mask=mask,
                         position_ids=positions, **{self.cache_name: cache})
        return out.logits[:, -1].float()


def crop_to(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions of a transformers DynamicCache (its ``crop`` takes the number of
    positions to remove, negated, in transformers 5)."""
    remove = int(cache.get_seq_length()) - length
    if remove > 0:
        cache.crop(-remove)


# ----------------------------------------------------------------------------------------------------
# One shared draw with the controlled draft
# ----------------------------------------------------------------------------------------------------
def shared_draw(target: Target, cache: Any, root_len: int, root_logits: torch.Tensor, law: Any,
                rng: np.random.Generator) -> tuple[DelayedDraws, dict[tuple[int, ...], NodeLaw]]:
    """Draft one :class:`DelayedDraws` from q with target forwards at every node that has draws.

    ``law(logits) -> NodeLaw`` (p and q of a node); ``cache`` holds the context (``root_len`` tokens) and is
    cropped back to it on return."""
    laws: dict[tuple[int, ...], NodeLaw] = {(): law(root_logits)}

    def draw(node: NodeLaw) -> int:
        return int(node.kept[rng.choice(node.kept.size, p=node.q)])

    spine: list[int] = []
    for j in range(L1_MAX + L2_MAX):
        token = draw(laws[tuple(spine)])
        spine.append(token)
        if j < L1_MAX + L2_MAX - 1:
            laws.setdefault(tuple(spine), law(target.step(cache, [token])[0]))
    # every trunk length's K_MAX - 1 branches in one batch: the context plus the whole trunk is cached once;
    # a row with a shorter trunk masks the trunk positions it does not have and keeps its own positions
    rows = [(l1, k) for l1 in range(L1_MAX + 1) for k in range(K_MAX - 1)]
    batch_cache = copy.deepcopy(cache)
    crop_to(batch_cache, root_len + L1_MAX)
    batch_cache.batch_repeat_interleave(len(rows))
    mask = torch.ones(len(rows), root_len + L1_MAX, dtype=torch.long)
    for row, (l1, _) in enumerate(rows):
        mask[row, root_len + l1:] = 0
    branches: list[list[int]] = [[] for _ in rows]
    for j in range(L2_MAX):
        tokens = [draw(laws[tuple(spine[:l1]) + tuple(b)]) for (l1, _), b in zip(rows, branches)]
        for b, t in zip(branches, tokens):
            b.append(t)
        if j < L2_MAX - 1:
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
            positions = torch.tensor([[root_len + l1 + j] for l1, _ in rows])
            logits = target.step(batch_cache, tokens, mask, positions)
            for (l1, _), b, row in zip(rows, branches, logits):
                laws.setdefault(tuple(spine[:l1]) + tuple(b), law(row))
    extra = [tuple(tuple(branches[l1 * (K_MAX - 1) + k]) for k in range(K_MAX - 1)) for l1 in range(L1_MAX + 1)]
    crop_to(cache, root_len)
    return DelayedDraws(tuple(spine), tuple(extra), K_MAX, L1_MAX, L2_MAX), laws


# ----------------------------------------------------------------------------------------------------
# Exact evaluation of one row
# ----------------------------------------------------------------------------------------------------
def cut(draws_of: dict[tuple[int, ...], list[int]], depth: int) -> dict[tuple[int, ...], list[int]]:
    return {prefix: node for prefix, node in draws_of.items() if len(prefix) < depth}


def evaluate(draws: DelayedDraws, laws: dict[tuple[int, ...], NodeLaw], seed: int) -> dict[str, Any]:
    """Exact E[tau + 1 | tree] of every method on every action's tree of one shared draw ([A] per method),
    acceptance mass by depth on the i.i.d. (K, 0, L2max) trees, and the Monte Carlo runs."""
    out: dict[str, Any] = {"be": {}, "depth_mass": {}, "measured": {}}
    for method in OT:
        cache: dict[Any, Any] = {}
        values = np.zeros(len(ACTIONS))
        masses = []
        for k in range(1, K_MAX + 1):
            for l1 in range(L1_MAX + 1):
                mass = ot_depth_mass(action_draws(draws, k, l1), laws, method, cache)
                cum = np.cumsum(np.pad(mass, (0, L1_MAX + L2_MAX + 1 - mass.size)))
                for l2 in range(L2_MAX + 1):
                    values[INDEX[(k, l1, l2)]] = cum[l1 + l2]
                if l1 == 0:
                    masses.append(np.pad(mass, (0, L2_MAX + 1 - mass.size)).tolist())
        out["be"][method] = values
        out["depth_mass"][method] = masses
    for method in SINGLE:
        values = np.full(L1_MAX + L2_MAX + 1, math.nan)  # the chain of L1max + L2max tokens is not evaluated
        values[0] = 1.0
        spine_draws = {tuple(draws.spine[:j]): [draws.spine[j]] for j in range(L1_MAX + L2_MAX - 1)}
        for length in range(1, L1_MAX + L2_MAX):
            tree, model = tree_of(cut(spine_draws, length), laws)
            values[length] = float(expected_block_efficiency(tree, model, method))
        out["be"][method] = values  # by chain length (index L), up to L1max + L2max - 1
    bv = out["be"]["bv"]
    values = np.zeros(len(ACTIONS))
    masses = []
    for k in range(1, K_MAX + 1):
        for l1 in range(L1_MAX + 1):
            full = action_draws(draws, k, l1)
            for l2 in range(L2_MAX + 1):
                if k == 1 or l2 == 0:  # a chain of L1 + L2 tokens: Traversal = BV in law
                    values[INDEX[(k, l1, l2)]] = bv[l1 + l2] if l1 + l2 < bv.size else math.nan
                    continue
                law = traversal_depth_law(*tree_of(cut(full, l1 + l2), laws))
                values[INDEX[(k, l1, l2)]] = float((law * np.arange(1, law.size + 1)).sum())
                if l1 == 0 and l2 == L2_MAX:
                    masses.append(np.cumsum(law[::-1])[::-1].tolist())
    out["be"]["traversal"] = values
    out["depth_mass"]["traversal"] = [[1.0] + [math.nan] * L2_MAX] + masses  # K = 1: see BV
    rng = np.random.default_rng(seed)
    k, l1, l2 = MEASURED["chain"]
    spine_draws = {tuple(draws.spine[:j]): [draws.spine[j]] for j in range(l2)}
    tree, model = tree_of(spine_draws, laws)
    for method in SINGLE:
        out["measured"][f"{method} {k},{l1},{l2}"] = verify(tree, model, method, GeneratorSource(rng)).accepted_depth + 1
    for shape in MEASURED["trees"]:
        k, l1, l2 = shape
        tree, model = tree_of(cut(action_draws(draws, k, l1), l1 + l2), laws)
        for method in OT + ("traversal",):
            out["measured"][f"{method} {k},{l1},{l2}"] = verify(tree, model, method, GeneratorSource(rng)).accepted_depth + 1
    return out


# ----------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------
def load_prompts(per_kind: int) -> list[str]:
    with open(PROMPTS_PATH) as fh:
        kinds: dict[str, list[str]] = json.load(fh)["kinds"]
    # prompt i of every kind, then prompt i + 1 ...: prompt index mod 5 = the kind (held-out folds mix kinds)
    return [texts[i] for i in range(per_kind) for texts in kinds.values()]


@torch.no_grad()
def sample_response(target: Target, ids: list[int], tokens: int, seed: int) -> list[int]:
    cache, logits, _ = target.prefill(ids)
    generator = torch.Generator().manual_seed(seed)
    out: list[int] = []
    last = logits[-1]
    for _ in range(tokens):
        token = int(torch.multinomial(torch.softmax(last.double(), -1), 1, generator=generator))
        out.append(token)
        last = target.step(cache, [token])[0]
    return out


def scalar_features(p_prev: np.ndarray, q_prev: np.ndarray, q_root: np.ndarray, context: int, temperature: float,
                    top_p: float, draft_cost: float) -> list[float]:
    from spec_fast.nde.selector import root_features

    one = torch.zeros(1, 1)
    feats = root_features(one, one, one, *(torch.from_numpy(v).view(1, -1) for v in (p_prev, q_prev, q_root)),
                          torch.tensor([float(context)]), torch.tensor([temperature]), torch.tensor([top_p]),
                          torch.tensor([draft_cost]), torch.tensor([1.0]))
    return [float(v) for v in feats.scalars[0].tolist()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny random Llama, 2 prompts x 1 root, 2 regimes")
    parser.add_argument("--prompts-per-kind", type=int, default=4)
    parser.add_argument("--roots", type=int, default=1, help="roots per prompt (every 16 sampled tokens)")
    parser.add_argument("--regimes", default=",".join(str(r) for r in REGIMES))
    parser.add_argument("--settings", default=";".join(f"{t},{p}" for t, p in SETTINGS))
    parser.add_argument("--top-k", type=int, default=128)
    parser.add_argument("--draft-cost", type=float, default=0.05, help="t_q of eq. 11, in target passes")
    parser.add_argument("--nde-methods", default="specinfer,khisti,spectr,naive_tree,nss")
    parser.add_argument("--nde-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--resume", action="store_true", help="keep the rows of rows.partial.npz under --out")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    if args.report_only:
        from bench.study_regimes_report import report

        report(args.out, args)
        return 0
    started = time.time()
    commit = git_commit()  # at the start: the tree may move on while the run goes
    regimes = tuple(float(r) for r in args.regimes.split(","))
    settings = tuple(tuple(float(x) for x in s.split(",")) for s in args.settings.split(";"))
    if args.quick:
        from bench.study_regimes_report import tiny_model

        model, prompts_ids = tiny_model()
        regimes, settings = (0.5, 0.9), ((0.2, 1.0),)
        args.nde_steps, args.nde_methods = min(args.nde_steps, 30), "specinfer"
        name = "tiny random Llama (V = 64, 2 layers; --quick)"
    else:
        from spec_fast.models import chat_prompt_ids, load_model

        model, tokenizer = load_model()
        texts = load_prompts(args.prompts_per_kind)
        prompts_ids = [chat_prompt_ids(tokenizer, t) for t in texts]
        name = "SmolLM2-135M-Instruct float32 (transformers forward)"
    model.eval()
    target = Target(model)
    roots: list[tuple[int, int, list[int]]] = []  # (prompt index, root index, context ids)
    for i, ids in enumerate(prompts_ids):
        response = sample_response(target, ids, INTERVAL * args.roots, args.seed + i)
        for r in range(args.roots):
            roots.append((i, r, ids + response[: INTERVAL * (r + 1)]))
    print(f"{len(roots)} roots sampled, {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    # eps per (setting, regime): mean root acceptance = the regime's target over every root
    prefills = []
    distances: dict[tuple[float, float], list[float]] = {s: [] for s in settings}
    for _, _, ids in roots:
        _, logits, _ = target.prefill(ids)
        prefills.append(logits)
        for s in settings:
            p, _ = sampling_law(logits[-1], s[0], s[1], args.top_k)
            distances[s].append(float(total_variation(p, rank_permuted_fast(p, 1.0, args.seed))))
    strengths = {(s, a): solve_strength(distances[s], a) for s in settings for a in regimes}
    records: list[dict[str, Any]] = []
    partial = os.path.join(args.out, "rows.partial.json")
    done: set[tuple[int, int, float, float, float]] = set()
    if args.resume and os.path.exists(partial):
        with open(partial) as fh:
            records = json.load(fh)
        done = {(r["prompt"], r["root"], r["temperature"], r["top_p"], r["regime"]) for r in records}
    for n, (prompt, root, ids) in enumerate(roots):
        cache, logits, hidden = target.prefill(ids)
        for s in settings:
            temperature, top_p = s
            for regime in regimes:
                if (prompt, root, temperature, top_p, regime) in done:
                    continue
                tick = time.time()
                strength = strengths[(s, regime)]
                removed: list[float] = []

                def law(row: torch.Tensor) -> NodeLaw:
                    p, cut_mass = sampling_law(row, temperature, top_p, args.top_k)
                    removed.append(cut_mass)
                    return reduce_pair(p, rank_permuted_fast(p, strength.eps, args.seed))

                rng = np.random.default_rng([args.seed, prompt, root, int(temperature * 100), int(top_p * 100),
                                             int(regime * 100)])
                draws, laws = shared_draw(target, cache, len(ids), logits[-1], law, rng)
                drafted = time.time() - tick
                result = evaluate(draws, laws, int(rng.integers(2**31)))
                p_prev, _ = sampling_law(logits[-2], temperature, top_p, args.top_k)
                p_root, _ = sampling_law(logits[-1], temperature, top_p, args.top_k)
                q_prev = rank_permuted_fast(p_prev, strength.eps, args.seed)
                q_root = rank_permuted_fast(p_root, strength.eps, args.seed)
                root_acc = float(np.minimum(p_root, q_root).sum())
                records.append({
                    "prompt": prompt, "root": root, "temperature": temperature, "top_p": top_p, "regime": regime,
                    "eps": strength.eps, "root_acceptance": root_acc, "context": len(ids),
                    "removed_mass": float(np.mean(removed)), "nodes": len(laws),
                    "vocab_kept_mean": float(np.mean([v.kept.size for v in laws.values()])),
                    "be": {m: v.tolist() for m, v in result["be"].items()}, "depth_mass": result["depth_mass"],
                    "measured": result["measured"],
                    "scalars": scalar_features(p_prev, q_prev, q_root, len(ids), temperature, top_p, args.draft_cost),
                    "hidden_prev": hidden[0].tolist(), "hidden_root": hidden[1].tolist(),
                    "load_average_1min": round(os.getloadavg()[0], 2),
                    "seconds": {"draft": round(drafted, 2), "evaluate": round(time.time() - tick - drafted, 2)},
                })
                with open(partial, "w") as fh:
                    json.dump(records, fh)
                print(f"root {n + 1}/{len(roots)} T={temperature} p={top_p} regime {regime}: eps {strength.eps:.3f} "
                      f"root acceptance {root_acc:.3f}, specinfer 4x8 {result['be']['specinfer'][INDEX[(4, 0, 8)]]:.2f}, "
                      f"traversal 4x8 {result['be']['traversal'][INDEX[(4, 0, 8)]]:.2f}; draft {drafted:.1f} s, "
                      f"evaluate {time.time() - tick - drafted:.1f} s", file=sys.stderr, flush=True)
    meta = {
        "command": "python bench/study_regimes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit,
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} at 1 thread",
        "model": name,
        "roots": len(roots), "prompts": len(prompts_ids), "settings": [list(s) for s in settings],
        "regimes": list(regimes), "top_k": args.top_k, "draft_cost": args.draft_cost, "seed": args.seed,
        "strengths": [{"temperature": s[0], "top_p": s[1], "regime": a, "eps": v.eps,
                       "achieved_root_acceptance": v.achieved_acceptance} for (s, a), v in strengths.items()],
        "load average at the end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rows seconds": round(time.time() - started, 1),
        "nde_methods": args.nde_methods, "nde_steps": args.nde_steps,
    }
    save_rows(args.out, meta, records)
    if os.path.exists(partial):
        os.remove(partial)
    from bench.study_regimes_report import report

    report(args.out, args)
    return 0


def save_rows(out: str, meta: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """``rows.json`` (meta and the small fields of every row) and ``rows.npz`` (the arrays, in row order)."""
    arrays: dict[str, np.ndarray] = {
        "hidden_prev": np.asarray([r.pop("hidden_prev") for r in records], dtype=np.float32),
        "hidden_root": np.asarray([r.pop("hidden_root") for r in records], dtype=np.float32),
        "scalars": np.asarray([r.pop("scalars") for r in records], dtype=np.float64),
    }
    be = [r.pop("be") for r in records]
    masses = [r.pop("depth_mass") for r in records]
    for method in METHODS:
        arrays[f"be_{method}"] = np.asarray([b[method] for b in be], dtype=np.float64)
        if method in masses[0]:
            arrays[f"depth_mass_{method}"] = np.asarray([m[method] for m in masses], dtype=np.float64)
    np.savez_compressed(os.path.join(out, "rows.npz"), **arrays)  # type: ignore[arg-type]
    with open(os.path.join(out, "rows.json"), "w") as fh:
        json.dump({"meta": meta, "rows": records}, fh, indent=0)


_RANKS: dict[tuple[int, int], np.ndarray] = {}


def rank_permuted_fast(p: np.ndarray, eps: float, seed: int) -> np.ndarray:
    """:func:`spec_ref.controlled_draft.rank_permuted_mixture` vectorised, without its per-call validation
    (hot path; the tests check the two agree)."""
    support = np.flatnonzero(p > 0)
    order = support[np.lexsort((support, -p[support]))]
    key = (order.size, seed)
    if key not in _RANKS:
        _RANKS[key] = vocab_permutation(order.size, seed)
    r = np.zeros_like(p)
    r[order] = p[order[_RANKS[key]]]
    return (1.0 - eps) * p + eps * r


if __name__ == "__main__":
    sys.exit(main())
