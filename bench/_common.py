"""Pieces shared by the SmolLM2 benchmarks (bench/engine.py, bench/drafts.py): HF ``generate`` runs and the
JSON + Markdown + PNG writer of ``bench/results/``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spec_fast.engine import SamplingParams


def hf_generate(model: Any, prompt: list[int], new: int, sampling: SamplingParams, eos: int | None,
                assistant: Any | None) -> tuple[list[int], float]:
    """HF ``generate`` (AR, or assisted generation with ``assistant``) under ``sampling`` ->
    ``(new tokens, seconds)``; sampling seeds torch's global generator with ``sampling.seed``."""
    kwargs: dict[str, Any] = {"max_new_tokens": new, "pad_token_id": eos, "eos_token_id": eos}
    if sampling.greedy:
        kwargs["do_sample"] = False
    else:
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        torch.manual_seed(sampling.seed)
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), **kwargs)
    return [int(t) for t in out[0, len(prompt):]], time.perf_counter() - start


def write_results(out_dir: str, name: str, title: str, meta: dict[str, Any], rows: list[dict[str, Any]],
                  table: Sequence[str], plot: Callable[[Any], Any]) -> None:
    """Write ``{name}.json`` (meta + rows), ``{name}.md`` (title, meta, then the ``table`` lines) and
    ``{name}.png`` (the figure ``plot(pyplot)`` returns; skipped without matplotlib) under ``out_dir``,
    and print the Markdown."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as fh:
        json.dump({"meta": meta, "results": rows}, fh, indent=2)
    lines = [f"# {title}", "", *(f"- {k}: {v}" for k, v in meta.items()), "", *table]
    with open(os.path.join(out_dir, f"{name}.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plot(plt)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=90)
    except ImportError:
        pass
    print("\n".join(lines))
