"""Train the committed drafts of spec_fast.drafts.heads (distilled, eagle, rnn) from SmolLM2-135M-Instruct on CPU.

Reproduce the committed weights (spec_fast/weights/*.safetensors) and the retrieval draft's datastore
(spec_fast/weights/datastore.npz: the target's responses to the training prompts, no training) with exactly:

    python scripts/train_drafts.py

(defaults: the 120 hand-written training prompts plus 1400 synthetic ones (spec_fast.drafts.prompts.synthetic_prompts),
one greedy response of <= 128 tokens each, top-32 teacher, 8192-token draft vocabulary, TrainConfig's steps x 8
sequences per draft, seed 0, 1 torch thread; see the docstring of TrainConfig for the measured time).
The held-out prompts (spec_fast.drafts.prompts.HELDOUT_PROMPTS) are never read.
``--steps N``, ``--prompts N`` and ``--synthetic N`` shrink the run for smoke tests; ``--out DIR`` writes
elsewhere; ``--data-cache FILE`` keeps the teacher data (generated once, reloaded by later runs with the same
data flags) so that the training half can be rerun alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from spec_fast.drafts.heads import WEIGHTS_DIR, distilled_state  # noqa: E402
from spec_fast.drafts.prompts import DATASTORE_EXCLUDED, HELDOUT_PROMPTS, TRAIN_PROMPTS, synthetic_prompts  # noqa: E402
from spec_fast.drafts.retrieval import datastore_sequences, save_datastore  # noqa: E402
from spec_fast.drafts.training import (  # noqa: E402
    TeacherData,
    TrainConfig,
    generate_responses,
    heldout_agreement,
    save_weights,
    teacher_forcing,
    train_distilled,
    train_head,
    vocabulary_subset,
)
from spec_fast.models import load_model  # noqa: E402


def load_data_cache(path: str) -> dict[str, Any]:
    """The teacher-data cache (tensors, lists, strings): ``weights_only=True``, so a tampered cache file
    cannot run code when it is unpickled."""
    cached = torch.load(path, weights_only=True)
    if not isinstance(cached, dict):
        raise ValueError(f"--data-cache {path!r} does not hold a teacher-data cache")
    return cached


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=WEIGHTS_DIR, help="output folder (default: spec_fast/weights)")
    parser.add_argument("--steps", type=int, default=None, help="steps per draft (default 300 distilled, 300 heads)")
    parser.add_argument("--prompts", type=int, default=len(TRAIN_PROMPTS), help="use the first N training prompts")
    parser.add_argument("--max-new-tokens", type=int, default=TrainConfig.max_new_tokens)
    parser.add_argument("--synthetic", type=int, default=TrainConfig.synthetic_prompts,
                        help="synthetic training prompts added to the hand-written ones")
    parser.add_argument("--samples", type=int, default=TrainConfig.samples, help="sampled responses per prompt (besides greedy)")
    parser.add_argument("--data-cache", default=None, help="file to keep / reload the teacher data")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on the shared 2-core machine 2 threads stall behind other jobs)")
    parser.add_argument("--drafts", default="distilled,eagle,rnn")
    parser.add_argument("--lr-distilled", type=float, default=TrainConfig.lr_distilled)
    parser.add_argument("--lr-head", type=float, default=TrainConfig.lr_head)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    base = TrainConfig()
    config = TrainConfig(
        max_new_tokens=args.max_new_tokens, samples=args.samples, seed=args.seed, synthetic_prompts=args.synthetic,
        lr_distilled=args.lr_distilled, lr_head=args.lr_head,
        steps_distilled=args.steps or base.steps_distilled, steps_head=args.steps or base.steps_head,
    )
    drafts = [d for d in args.drafts.split(",") if d]
    start = time.perf_counter()
    target, tokenizer = load_model()
    for p in target.parameters():
        p.requires_grad_(False)
    prompts = list(TRAIN_PROMPTS[: args.prompts]) + synthetic_prompts(config.synthetic_prompts, config.seed)
    data_key = json.dumps([prompts, config.max_new_tokens, config.samples, config.top_k, config.seed, args.threads])
    cached = load_data_cache(args.data_cache) if args.data_cache and os.path.exists(args.data_cache) else None
    if cached is not None and cached["key"] == data_key:
        pairs, data = cached["pairs"], TeacherData(**cached["data"])
        print(f"teacher data reloaded from {args.data_cache}", file=sys.stderr)
    else:
        n_seq = len(prompts) * (1 + config.samples)
        with tqdm(total=n_seq, desc="target responses", unit="seq") as bar:
            pairs = generate_responses(target, tokenizer, prompts, config, lambda _, n: bar.update(n))
        with tqdm(total=len(pairs), desc="teacher forcing", unit="seq") as bar:
            data = teacher_forcing(target, pairs, config.top_k, progress=lambda _, n: bar.update(n))
        cached = {"key": data_key, "pairs": pairs, "data": data.__dict__}
    if "heldout" not in cached:
        # evaluation only: the target's greedy responses to the held-out prompts (never trained on)
        greedy_only = TrainConfig(max_new_tokens=config.max_new_tokens, samples=0, seed=config.seed)
        responses = generate_responses(target, tokenizer, HELDOUT_PROMPTS, greedy_only)
        cached["heldout"] = teacher_forcing(target, responses, config.top_k).__dict__
        if args.data_cache:
            torch.save(cached, args.data_cache)
    heldout = TeacherData(**cached["heldout"])
    specials = [t for t in (tokenizer.all_special_ids or []) if t is not None]
    vocab_ids = vocabulary_subset(data, config.vocab_subset, int(target.config.vocab_size), specials)
    tokens = int(data.lengths.sum())
    print(f"data: {len(pairs)} sequences, {tokens} tokens, {time.perf_counter() - start:.0f}s", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    # the retrieval draft's datastore: the target's responses to the training prompts (no training), less
    # the near-paraphrases of benchmark prompts (DATASTORE_EXCLUDED, tests/drafts/test_prompt_hygiene.py)
    # (pairs hold one round over every prompt per sample round: pair i answers prompts[i % len(prompts)])
    kept = [pair for i, pair in enumerate(pairs) if prompts[i % len(prompts)] not in DATASTORE_EXCLUDED]
    save_datastore(os.path.join(args.out, "datastore.npz"), datastore_sequences(kept),
                   {"command": "python scripts/train_drafts.py", "sequences": str(len(kept)),
                    "prompts": "TRAIN_PROMPTS + synthetic_prompts (spec_fast.drafts.prompts)",
                    "excluded": json.dumps(list(DATASTORE_EXCLUDED))})
    meta_common = {
        "command": "python scripts/train_drafts.py" + ("" if argv is None and len(sys.argv) == 1 else " " + " ".join(sys.argv[1:])),
        "config": json.dumps(config.__dict__, sort_keys=True),
        "train_sequences": str(len(pairs)), "train_tokens": str(tokens), "threads": str(args.threads),
    }
    report: dict[str, list[float]] = {}
    if "distilled" in drafts:
        with tqdm(total=config.steps_distilled, desc="distilled", unit="step") as bar:
            def tick(msg: str, n: int) -> None:
                bar.set_postfix_str(msg)
                bar.update(n)
            draft = train_distilled(target, data, vocab_ids, config, (0,), progress=tick)
        agreement = heldout_agreement(draft, heldout)
        report["distilled"] = agreement
        save_weights(os.path.join(args.out, "distilled.safetensors"), distilled_state(draft), vocab_ids,
                     {**meta_common, "init_layers": "0", "heldout_agreement": json.dumps(agreement)})
    for kind in ("eagle", "rnn"):
        if kind not in drafts:
            continue
        with tqdm(total=config.steps_head, desc=kind, unit="step") as bar:
            def tick2(msg: str, n: int) -> None:
                bar.set_postfix_str(msg)
                bar.update(n)
            head = train_head(target, kind, data, vocab_ids, config, progress=tick2)
        agreement = heldout_agreement(head, heldout)
        report[kind] = agreement
        save_weights(os.path.join(args.out, f"{kind}.safetensors"), head.new_state(), vocab_ids,
                     {**meta_common, "heldout_agreement": json.dumps(agreement)})
    for name, agreement in report.items():
        print(f"{name}: held-out teacher-forced top-1 agreement " + ", ".join(f"{a:.3f}" for a in agreement),
              file=sys.stderr)
    print(f"done in {time.perf_counter() - start:.0f}s -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
