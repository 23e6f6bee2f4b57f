"""Which model draft should the NDE selector use? Held-out acceptance and pass cost of distilled, rnn and eagle.

    python scripts/selector_drafts.py              # 8 prompts per setting x 80 tokens (about 5 min, 1 thread)

The NDE selector reads a draft's hidden states, so only model drafts qualify (not retrieval). For each
sampling setting (T, top-p) in {0.6, 1.0} x {0.9, 1.0} the target samples responses to prompts of the
selector's held-out pool (scripts/selector_dataset.py's prompts after the dataset's own, never used by the
drafts' training), then every draft is teacher-forced on them and scored by the exact expected acceptance
of one draft token, ``beta = sum_x min(p(x), q(x))`` with p, q = G of the target and draft logits (the
probability that naive verification accepts a token drawn from q; seed 002 appendix C): at depth 1 (the
head reads the target's true feature of the previous token, as the first token of a tree does) and at
depth 2 (a head reads the feature it predicted itself one position earlier; the distilled draft is a full
language model, so its depth-2 law is its depth-1 law on the same text). Also the share of positions with
beta > 0.9 (where a speculative step can pay on a CPU whose wider passes cost much more) and the median
time of one draft pass of 1 and 4 entries behind a 160-token context (with the engine's decoding operator
on its rows). Writes bench/results/selector_drafts.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

SETTINGS = ((0.6, 0.9), (0.6, 1.0), (1.0, 0.9), (1.0, 1.0))


def main(argv: list[str] | None = None) -> int:
    from bench._git import git_commit
    from spec_fast.decoding import decoding_operator
    from spec_fast.drafts.heads import load_distilled, load_drafter, load_head
    from spec_fast.drafts.training import TrainConfig
    from spec_fast.nde.latency import engine_law, measure_law_time, measure_pass_times
    from spec_fast.models import chat_prompt_ids, load_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per setting")
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--skip", type=int, default=100, help="pool prompts left to the selector dataset")
    parser.add_argument("--out", default=os.path.join("bench", "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    target, tokenizer = load_model()
    distilled = load_distilled(target)
    heads = {name: load_head(target, name) for name in ("rnn", "eagle")}
    from spec_fast.drafts.prompts import synthetic_prompts

    # the selector dataset's pool (prompts after those that trained the drafts), past the dataset's own
    used = TrainConfig.synthetic_prompts + args.skip
    pool = synthetic_prompts(used + 4 * args.prompts, TrainConfig.seed)[used:]
    eos = int(tokenizer.eos_token_id)

    def law(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
        rows = logits.shape[0]
        return decoding_operator(logits.float(), torch.full((rows,), temperature), torch.zeros(rows, dtype=torch.long),
                                 torch.full((rows,), top_p))

    results: dict[str, dict[str, dict[str, float]]] = {}
    for s, (temperature, top_p) in enumerate(SETTINGS):
        chunk = [chat_prompt_ids(tokenizer, pool[i]) for i in range(s, len(pool), 4)]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), eos)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for b, p in enumerate(chunk):  # left padding for generation
            ids[b, width - len(p):] = torch.tensor(p)
            mask[b, width - len(p):] = 1
        torch.manual_seed(s)
        with torch.no_grad():
            generated = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                        do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                        pad_token_id=eos, eos_token_id=eos)
        betas: dict[str, list[float]] = {k: [] for k in ("distilled", "rnn_depth1", "rnn_depth2", "eagle_depth1", "eagle_depth2")}
        for b, prompt in enumerate(chunk):
            response = generated[b, width:].tolist()
            if eos in response:
                response = response[: response.index(eos)]
            sequence = torch.tensor([prompt + response])
            lo, hi = len(prompt) - 1, sequence.shape[1] - 1  # the positions that predict response tokens
            with torch.no_grad():
                out = target(input_ids=sequence, output_hidden_states=True, use_cache=False)
                target_law = law(out.logits[0, lo:hi], temperature, top_p)
                q = law(distilled(input_ids=sequence, use_cache=False).logits[0, lo:hi], temperature, top_p)
                betas["distilled"] += torch.minimum(target_law, q).sum(-1).tolist()
                features = out.hidden_states[-1]
                for name, head in heads.items():
                    embeds = head.embed[0](sequence)

                    def shifted(f: torch.Tensor) -> torch.Tensor:
                        return torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], dim=1)

                    first = head.features(embeds, shifted(features))
                    second = head.features(embeds, shifted(first))
                    for depth, predicted in ((1, first), (2, second)):
                        q = law(head.head(predicted)[0, lo:hi], temperature, top_p)
                        betas[f"{name}_depth{depth}"] += torch.minimum(target_law, q).sum(-1).tolist()
        results[f"T={temperature}, top-p={top_p}"] = {
            k: {"mean_beta": sum(v) / len(v), "share_above_0.9": sum(x > 0.9 for x in v) / len(v), "positions": len(v)}
            for k, v in betas.items()}
        print(f"setting {s + 1}/4 done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    costs: dict[str, dict[str, float]] = {}
    vocab = int(target.get_output_embeddings().weight.shape[0])
    law_row = measure_law_time(vocab)
    for name in ("distilled", "rnn", "eagle"):
        drafter = load_drafter(name, target)
        points = measure_pass_times(drafter, vocab, (160,), (1, 4), repeats=7)
        costs[name] = {f"pass_ms_width_{p.width}": 1000 * p.seconds for p in points}
        costs[name].update({f"with_laws_ms_width_{p.width}": 1000 * (p.seconds + p.width * law_row) for p in points})
    meta = {"command": "python scripts/selector_drafts.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "commit": git_commit(), "seconds": round(time.perf_counter() - start, 1),
            "decoding operator ms per row": round(1000 * law_row, 2), "engine_law": engine_law.__doc__ or ""}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "selector_drafts.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "acceptance": results, "pass_cost": costs}, handle, indent=1)
    lines = ["# Model drafts for the NDE selector: held-out acceptance and pass cost", "",
             f"Command: `{meta['command']}` (commit {meta['commit']}, 1 torch thread, shared 2-core CPU, {meta['seconds']} s).", "",
             "Mean expected acceptance of one draft token, beta = sum_x min(p, q) (teacher-forced on the target's own "
             "sampled responses to held-out pool prompts), and the share of positions with beta > 0.9:", "",
             "| setting | " + " | ".join(results[next(iter(results))]) + " |",
             "|---" * (1 + len(results[next(iter(results))])) + "|"]
    for setting, row in results.items():
        lines.append(f"| {setting} | " + " | ".join(f"{v['mean_beta']:.3f} ({v['share_above_0.9']:.2f})" for v in row.values()) + " |")
    lines += ["", f"Draft pass behind 160 tokens, median ms (with the decoding operator on its rows, {1000 * law_row:.1f} ms per row):", "",
              "| draft | 1 entry | 4 entries | 1 entry + law | 4 entries + laws |", "|---|---|---|---|---|"]
    for name, c in costs.items():
        lines.append(f"| {name} | {c['pass_ms_width_1']:.1f} | {c['pass_ms_width_4']:.1f} | {c['with_laws_ms_width_1']:.1f} | "
                     f"{c['with_laws_ms_width_4']:.1f} |")
    with open(os.path.join(args.out, "selector_drafts.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
