"""A small demonstration of the token-level core: ``python -m spec_ref.demo``.

For one target/draft pair (built from logits through the decoding operator G), prints each solver's
acceptance rate for k = 1..4 drafts (exact closed form, appendix C; Khisti's exact rate by enumeration and
its Alg 10 lower bound), then one verified sample per solver with a seeded generator.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from spec_ref import SOLVERS, KhistiSolver, decoding_operator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spec_ref.demo", description=__doc__)
    parser.add_argument("--vocab-size", type=int, default=6)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    target_logits = rng.normal(0.0, 1.5, args.vocab_size)
    draft_logits = target_logits + rng.normal(0.0, 1.0, args.vocab_size)
    target = decoding_operator(target_logits, args.temperature, args.top_k, args.top_p)
    draft = decoding_operator(draft_logits, args.temperature, args.top_k, args.top_p)
    print(f"target_probs = {np.array2string(target, precision=3)}")
    print(f"draft_probs  = {np.array2string(draft, precision=3)}")
    print()
    header = "solver      " + "".join(f"   k={k}  " for k in range(1, 5))
    print("acceptance rate P(Y in drafts)")
    print(header)
    for name, solver in SOLVERS.items():
        rates = [float(solver.acceptance(target, draft, k)) for k in range(1, 5)]
        print(f"{name:<12}" + "".join(f"  {r:.4f} " for r in rates))
    khisti = SOLVERS["khisti"]
    assert isinstance(khisti, KhistiSolver)
    bounds = [float(khisti.acceptance_lower_bound(target, draft, k)) for k in range(1, 5)]
    print(f"{'khisti(LB)':<12}" + "".join(f"  {b:.4f} " for b in bounds))
    print()
    draws = tuple(int(t) for t in rng.choice(args.vocab_size, size=3, p=draft))
    print(f"one verified sample for the drafts {draws} (seed {args.seed}):")
    for name, solver in SOLVERS.items():
        token = solver.sample(target, draft, draws, np.random.default_rng(args.seed))
        status = "one of the drafts" if token in draws else "not among the drafts"
        print(f"  {name:<10} -> token {token} ({status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
