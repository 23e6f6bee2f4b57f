"""Compare two sets of trained draft weights (reproducibility check of scripts/train_drafts.py).

    python scripts/compare_drafts.py spec_fast/weights /tmp/rerun --tolerance 0.01

For every draft present in both folders: the held-out teacher-forced top-1 agreement that
``train_drafts.py`` stored in the weights' metadata, and the largest absolute difference of any weight.
Exits 1 when an agreement differs by more than ``--tolerance`` (absolute) or a draft is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from spec_fast.drafts.heads import DRAFT_NAMES  # noqa: E402


def _read(folder: str, name: str) -> tuple[dict[str, torch.Tensor], list[float]] | None:
    path = os.path.join(folder, f"{name}.safetensors")
    if not os.path.exists(path):
        return None
    with safe_open(path, framework="pt") as handle:
        meta = handle.metadata() or {}
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    return tensors, json.loads(meta.get("heldout_agreement", "[]"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference")
    parser.add_argument("candidate")
    parser.add_argument("--tolerance", type=float, default=0.01, help="largest allowed agreement difference")
    args = parser.parse_args(argv)
    ok = True
    for name in DRAFT_NAMES:
        ref, cand = _read(args.reference, name), _read(args.candidate, name)
        if ref is None or cand is None:
            print(f"{name}: missing in {'reference' if ref is None else 'candidate'}")
            ok = False
            continue
        (ref_t, ref_a), (cand_t, cand_a) = ref, cand
        diff = max((float((ref_t[k].float() - cand_t[k].float()).abs().max()) for k in ref_t if k in cand_t),
                   default=float("nan"))
        gaps = [abs(a - b) for a, b in zip(ref_a, cand_a)]
        good = len(ref_a) == len(cand_a) > 0 and max(gaps) <= args.tolerance and ref_t.keys() == cand_t.keys()
        ok &= good
        print(f"{name}: agreement {ref_a} vs {cand_a} (max gap {max(gaps, default=float('nan')):.4f}), "
              f"max |weight difference| {diff:.3g} -> {'ok' if good else 'DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
