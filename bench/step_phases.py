"""Where a decoding step's time goes on the default model, by rows and draft depth, measured side by side.

Engines of the default model (the CLI's settings: the GGUF file's blocks on the lean forward) decode tuning
chat prompts (``bench.workloads.TUNING``; this is a diagnostic that informs the batch policy's defaults, so it
stays off the held-out prompts) in five cells: plain decoding of 1 and 4 requests, and the default draft and
strategy at 1 and 2 requests with each step's depth forced to 0 (a plain step of the drafting decoder) or to
its strategy's depth. The cells take turns in blocks of ``--block`` steps, ``--rounds`` rounds (the order reversed
every other round), so that a slow phase of the shared machine weighs on all of them alike; the two depths of
the default at a row count take turns on one engine, so they are timed at the same context lengths. Each
phase's ms per step is the median over the rounds. Phases: drafting, the target pass (within it the native decoder layers and the LM head product),
a plain step (a step without drafts, spec_fast/engine/plain_step.py: its pass, then the verification and commit
of a one-node tree inline; its pass with a head of blocks is one native call of layers and head),
verification, the commit (within it the native move of ragged rows' kept entries), and the whole engine step.
The same run also measures the step table the batch-aware default reads
(``spec_fast.engine.batch_depth.measure_step_cost``), to set its ratios beside the ones of real decoding.
``--draft NAME [--strategy S]`` times that draft in place of the default's (a trained head's level
in one native call shows as its native head levels). Writes ``bench/results/step_phases.{json,md,png}``. ``--temperature T`` times sampled requests instead, with the
retrieval draft and the strategy a named draft gets when sampling (``chain:1``): where a sampled drafted step's
time goes against a sampled plain step.

    python bench/step_phases.py            # about 3 minutes on 2 cores, 1 thread
    python bench/step_phases.py --temperature 0.7 --out bench/results/step_phases_sampled
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from bench.workloads import TUNING  # noqa: E402
from spec_fast.api import load_decoder  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.engine.batch_depth import forcing, measure_step_cost  # noqa: E402
from spec_fast.engine.batch_engine import BatchEngine  # noqa: E402
import spec_fast.engine.decoder as decoder_module  # noqa: E402
from spec_fast.engine.decoder import SpeculativeDecoder  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.lean import causal_pass  # noqa: E402
from spec_fast.lean import feature_mlp as feature_mlp_module  # noqa: E402
from spec_fast.lean import native  # noqa: E402
from spec_fast.models import chat_prompt_ids  # noqa: E402
from spec_fast.settings import resolve_settings  # noqa: E402

#: (label, key) of each timed phase, in the order of a step
PHASES = (("draft", "draft"), ("  its native head levels", "draft_level"), ("target pass", "target"), ("plain step", "plain"), ("  its pass", "plain_pass"),
          ("native layers", "layers"), ("LM head", "lm_head"), ("layers + head in one call", "fused"),
          ("verify", "verify"), ("commit", "commit"), ("  ragged move", "move"), ("engine step", "step"))


class PhaseTimer:
    """Wall seconds accumulated per phase while installed (wraps the named callables; ``remove`` restores them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, key: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def remove(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=10, help="timed steps of a cell per round")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="> 0: sampled requests (seed = the request's index), and the retrieval draft with the "
                             "strategy a named draft gets when sampling (the default itself then decodes plain)")
    parser.add_argument("--draft", default=None,
                        help="time this draft instead of the default's, e.g. rnn+retrieval")
    parser.add_argument("--strategy", default=None, help="with --draft: its strategy (default: the CLI's for it)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    plain, tokenizer = load_decoder(resolve_settings(strategy="ar"))
    sampled = args.temperature > 0
    if args.draft is not None:
        default_settings = resolve_settings(draft=args.draft, strategy=args.strategy, temperature=args.temperature)
    elif sampled:
        default_settings = resolve_settings(draft="retrieval", temperature=args.temperature)
    else:
        default_settings = resolve_settings()
    speculative = load_decoder(default_settings)[0]
    depth = speculative.strategy.depth
    prompts = [chat_prompt_ids(tokenizer, p) for p in TUNING["chat"]]
    table = measure_step_cost(speculative, depth, rows=(1, 2, 4)).seconds

    cells: dict[str, tuple[SpeculativeDecoder, int, int | None]] = {
        "plain, 1 row": (plain, 1, None), "plain, 4 rows": (plain, 4, None),
        "default at depth 0, 1 row": (speculative, 1, 0), f"default at depth {depth}, 1 row": (speculative, 1, depth),
        "default at depth 0, 2 rows": (speculative, 2, 0), f"default at depth {depth}, 2 rows": (speculative, 2, depth),
    }
    # one engine per decoder and row count: a drafting decoder's cells at depth 0 and at its depth take turns on
    # the same requests, so both are timed at the same context lengths (an engine of its own at each depth ran
    # ahead in context at the deeper one, and its attention cost more for that alone)
    engines: dict[tuple[int, int], BatchEngine] = {}
    for decoder, rows, _ in cells.values():
        key = (id(decoder), rows)
        if key not in engines:
            engine = BatchEngine(decoder, max_batch_size=rows, depth_policy="fixed")
            for j in range(rows):
                # long enough that no request ends within the run (the steps stay at `rows` rows): every step
                # emits at most depth + 1 tokens
                engine.add_request(prompts[(len(engines) + j) % len(prompts)],
                                   SamplingParams(temperature=args.temperature, seed=j),
                                   2 * (depth + 1) * (args.rounds + 1) * (args.block + 1) + 64)
            engine.step()
            engines[key] = engine

    timer = PhaseTimer()
    # a step without drafts runs as one plain step (spec_fast/engine/plain_step.py: its pass, then the
    # verification and commit of a one-node tree inline), its pass with a head of blocks as one native call
    for owner, name, key in ((SpeculativeDecoder, "_draft_phase", "draft"), (SpeculativeDecoder, "_target_phase", "target"),
                             (decoder_module, "plain_step", "plain"), (TreeKVCache, "forward_committed", "plain_pass"),
                             (native, "run_layers", "layers"), (native, "mm_blocks", "lm_head"),
                             (causal_pass, "_layers_and_head", "fused"),
                             (SpeculativeDecoder, "_verify_phase", "verify"), (SpeculativeDecoder, "_commit_phase", "commit"),
                             (native, "move_entries", "move"), (BatchEngine, "step", "step"),
                             (feature_mlp_module, "feature_mlp", "draft_level")):
        timer.wrap(owner, name, key)
    per_round: dict[str, list[dict[str, float]]] = {name: [] for name in cells}
    tokens: dict[str, int] = {name: 0 for name in cells}
    loads = []
    try:
        names = list(cells)
        for round_index in range(args.rounds):
            loads.append(os.getloadavg()[0])
            # the order reverses every round, so that neither depth of an engine always runs at the longer context
            for name in names if round_index % 2 == 0 else names[::-1]:
                decoder, rows, forced = cells[name]
                engine = engines[(id(decoder), rows)]
                assert engine.state is not None
                if forced is not None:
                    engine.state.step_cost = forcing(forced, depth)
                engine.step()  # untimed: the first step after a switch of depth
                timer.seconds.clear()
                for _ in range(args.block):
                    tokens[name] += sum(len(out.new_tokens) for out in engine.step())
                per_round[name].append({k: 1000 * v / args.block for k, v in timer.seconds.items()})
    finally:
        timer.remove()

    rows_out: list[dict[str, Any]] = []
    for name, (_, rows, forced) in cells.items():
        ms = {key: statistics.median(r.get(key, 0.0) for r in per_round[name]) for _, key in PHASES}
        rows_out.append({"cell": name, "rows": rows, "depth": forced, "ms": ms,
                         "tokens_per_step": tokens[name] / (args.rounds * args.block),
                         "step_ms_of_every_round": [r.get("step", 0.0) for r in per_round[name]]})
    by_name = {r["cell"]: r for r in rows_out}

    def ratio(a: str, b: str) -> float:
        return float(by_name[a]["ms"]["step"] / by_name[b]["ms"]["step"])

    ratios = {
        "plain 4 rows / 1 row": ratio("plain, 4 rows", "plain, 1 row"),
        f"default depth {depth} / depth 0, 1 row": ratio(f"default at depth {depth}, 1 row", "default at depth 0, 1 row"),
        f"default depth {depth} / depth 0, 2 rows": ratio(f"default at depth {depth}, 2 rows", "default at depth 0, 2 rows"),
    }
    table_ratios = {f"{r} row(s): depth {depth} / depth 0": table[(r, depth + 1)] / table[(r, 1)] for r in (1, 2, 4)}
    meta = {
        "command": "python bench/step_phases.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(), "hardware": f"{platform.machine()}, {os.cpu_count()} CPU cores, 1 torch thread",
        "model": f"{default_settings.model.describe()}, quantize {default_settings.quantize}",
        "default": f"{default_settings.draft}, {default_settings.strategy.label()}",
        "prompts": "bench.workloads.TUNING chat (a diagnostic for the policy's defaults: off the held-out prompts), "
                   + (f"sampled at T = {args.temperature} (seed = the request's index)" if sampled else "greedy")
                   + ", no end-of-sequence token: every request decodes to the end of the run",
        "method": f"the cells take turns in blocks of {args.block} steps (after one untimed step), {args.rounds} "
                  "rounds, the order reversed every other round; the default's two depths at a row count on one "
                  "engine (the same requests and contexts); ms per step = median over the rounds",
        "load average (1 min) over the rounds": f"{min(loads):.1f} to {max(loads):.1f}",
        # (the default's engines run ahead of plain's in context, by the tokens its drafts add: compare the
        # default with plain decoding in bench/batch.py, not here)
        "step ratios in decoding": {k: round(v, 3) for k, v in ratios.items()},
        "step ratios in the policy's table (measure_step_cost, same run)": {k: round(v, 3)
                                                                            for k, v in table_ratios.items()},
    }
    lines = ["| cell | tokens/step | " + " | ".join(label.strip() for label, _ in PHASES) + " |",
             "|---|---:|" + "---:|" * len(PHASES)]
    for r in rows_out:
        lines.append(f"| {r['cell']} | {r['tokens_per_step']:.2f} | "
                     + " | ".join(f"{r['ms'][key]:.2f}" for _, key in PHASES) + " |")
    lines += ["", "ms per step (median over the rounds); indented phases are parts of the one above them; native "
              "layers, LM head and the one call are parts of whichever pass ran them."]

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(8, 3.6))
        parts: list[tuple[str, Callable[[dict[str, float]], float]]] = [
            ("native layers", lambda m: m["layers"]), ("LM head", lambda m: m["lm_head"]),
            ("layers + head, one call", lambda m: m["fused"]),
            ("rest of the pass", lambda m: m["target"] + m["plain_pass"] - m["layers"] - m["lm_head"] - m["fused"]),
            ("plain step's verify and commit", lambda m: m["plain"] - m["plain_pass"]),
            ("draft", lambda m: m["draft"]), ("verify", lambda m: m["verify"]), ("commit", lambda m: m["commit"]),
            ("engine", lambda m: m["step"] - m["target"] - m["plain"] - m["draft"] - m["verify"] - m["commit"])]
        bottom = [0.0] * len(rows_out)
        for label, part in parts:
            values = [max(0.0, part(r["ms"])) for r in rows_out]
            ax.barh([r["cell"] for r in rows_out], values, left=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_xlabel("ms per step (1 thread)")
        ax.invert_yaxis()
        ax.legend(fontsize=7, loc="lower right")
        return fig

    write_results(args.out, "step_phases", "Where a decoding step's time goes, by rows and draft depth", meta,
                  rows_out, lines, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
