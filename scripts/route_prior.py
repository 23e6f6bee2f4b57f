"""Learn the prior tables of calibrated routing (docs/algorithms.md section 8) and write
``spec_fast/weights/route_prior.json``.

For each committed drafter (``rnn``, ``eagle``, ``retrieval``) the table holds, per class of its confidence
feature (draft probability bin, or retrieval match-length class x single follower), how often a node of that
class was offered and matched the committed text. The counts are what ``--dual route-calibrated`` itself
counts in a generation (``DecodeState.proposal.calibration``), summed over calibration runs of the pairs
(rnn, retrieval) and (eagle, retrieval) with no table (1/2 per class), so the table does not depend on an
earlier one. Both heads are counted at every step, whichever was verified.

Calibration prompts, disjoint from every evaluation prompt and from the retrieval datastore: the synthetic
prompts that follow the training ones in the seeded order (same templates and subjects as the drafts'
training data, never used in training), and input-grounded prompts over three passages written for this
script (``bench/dual.py`` and ``bench/defaults.py`` use another passage). Each prompt greedy and at
T = 0.7 / top-p 0.9 (seed = prompt index), 32 new tokens, ``chain:2`` per head, as in ``bench/dual.py``.

    python scripts/route_prior.py --threads 1            # 40 chat + 12 grounded prompts (about 15 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.drafts.dual import DualDrafter  # noqa: E402
from spec_fast.drafts.dual_calibration import ROUTE_PRIOR_PATH, head_feature  # noqa: E402
from spec_fast.drafts.heads import load_drafter  # noqa: E402
from spec_fast.drafts.prompts import HELDOUT_PROMPTS, synthetic_prompts  # noqa: E402
from spec_fast.drafts.training import TrainConfig  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.models import chat_prompt_ids, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402

PASSAGES = (
    "The village bakery on Mill Street was founded in 1932 by two sisters who had learned to bake in their "
    "mother's kitchen. For the first ten years they sold only bread, baked in a wood oven before dawn. After the "
    "war they added cakes and pastries, and in 1968 the bakery moved into the larger shop next door. Today it "
    "employs eleven people, bakes about six hundred loaves every day and still uses the original recipe for its "
    "rye bread. The shop opens at six in the morning and closes at two in the afternoon, except on Mondays, when "
    "it stays closed so the ovens can be cleaned.",
    "Honey bees live in colonies of up to sixty thousand insects. Each colony has one queen, a few hundred male "
    "drones and thousands of female workers. The workers collect nectar and pollen, build the wax comb, feed the "
    "young and guard the entrance of the hive. A worker bee lives about six weeks in summer, but bees born in "
    "autumn can survive the whole winter by clustering together and shivering to keep warm. To tell the others "
    "where food is, a returning worker performs a dance whose direction points towards the flowers and whose "
    "length tells the distance.",
    "The regional cycling race starts at the harbour at eight o'clock on Sunday morning. Riders follow the coast "
    "road for forty kilometres, climb the hill to the old castle and return through the forest to the town "
    "square. Three hundred and twenty riders have registered this year, sixty more than last year. Water is "
    "handed out at the lighthouse and at the castle gate. Roads along the route close from seven until one, and "
    "buses to the harbour are replaced by a shuttle from the train station every fifteen minutes.",
)
TASKS = (
    "Summarise this text in two sentences:\n\n{p}",
    "Explain this text to a ten-year-old:\n\n{p}",
    "Write down every number in this text and what it refers to:\n\n{p}",
    "Repeat the first two sentences of this text word for word, then add a short title:\n\n{p}",
)
GROUNDED = tuple(t.format(p=p) for p in PASSAGES for t in TASKS)
PAIRS = (("rnn", "retrieval"), ("eagle", "retrieval"))
SAMPLINGS = {"greedy": lambda seed: SamplingParams(),
             "T=0.7,top-p=0.9": lambda seed: SamplingParams(temperature=0.7, top_p=0.9, seed=seed)}


def calibration_prompts(chat: int) -> list[str]:
    """``chat`` synthetic prompts after the training ones, then the grounded ones."""
    config = TrainConfig()
    unused = synthetic_prompts(config.synthetic_prompts + chat, config.seed)[config.synthetic_prompts:]
    assert not set(unused) & set(HELDOUT_PROMPTS)
    return unused + list(GROUNDED)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chat-prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=ROUTE_PRIOR_PATH)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    names = sorted({n for p in PAIRS for n in p})
    drafters = {n: load_drafter(n, model) for n in names}
    prompts = calibration_prompts(args.chat_prompts)
    totals: dict[str, list[list[int]]] = {}
    start = time.perf_counter()
    for first, second in PAIRS:
        decoder = SpeculativeDecoder(model, DualDrafter(drafters[first], drafters[second], "route-calibrated"),
                                     parse_strategy("chain:2"))
        for sampling_name, sampling in SAMPLINGS.items():
            for index, text in enumerate(prompts):
                result = decoder.generate([chat_prompt_ids(tokenizer, text)], max_new_tokens=args.max_new_tokens,
                                          sampling=sampling(index), eos_token_id=tokenizer.eos_token_id)
                assert result.state is not None and result.state.proposal.calibration is not None
                calibration = result.state.proposal.calibration
                for h, name in enumerate((first, second)):
                    row = totals.setdefault(name, [[0] * calibration.offers.shape[-1] for _ in range(2)])
                    for k, (o, m) in enumerate(zip(calibration.offers[0, h].tolist(),
                                                   calibration.matches[0, h].tolist())):
                        row[0][k] += o
                        row[1][k] += m
            print(f"[{time.perf_counter() - start:.0f}s] ({first}, {second}) {sampling_name} done", file=sys.stderr,
                  flush=True)
    from spec_ref.dual_calibration import num_classes

    tables = {}
    for name, (offers, matches) in totals.items():
        feature = head_feature(drafters[name])
        size = num_classes(feature)
        tables[name] = {"feature": feature, "offers": offers[:size], "matches": matches[:size]}
    meta = {
        "command": "python scripts/route_prior.py " + " ".join(sys.argv[1:]), "commit": git_commit(),
        "prompts": f"{args.chat_prompts} synthetic prompts after the training ones + {len(GROUNDED)} grounded "
                   f"(scripts/route_prior.py), greedy and T=0.7/top-p 0.9 (seed = prompt index), "
                   f"{args.max_new_tokens} new tokens, chain:2 per head, pairs {PAIRS}",
        "wall_s": round(time.perf_counter() - start, 1),
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "drafters": tables}, handle, indent=1)
        handle.write("\n")
    print(json.dumps(tables))


if __name__ == "__main__":
    main()
