"""Where a BatchEngine step's host time goes: cProfile and torch's op profiler around plain-decoding steps of a
random-weight Llama shape (bench/gpu_check.py's shapes), with the model's forward timed separately.

Usage: ``python bench/step_profile.py [--device cuda] [--shape 135M] [--requests 1,4] [--steps 30]
[--layers N] [--out DIR]``; prints to stdout and writes ``DIR/step_profile_<device>.txt`` when ``--out`` is set.
A diagnostic, not a benchmark: it reports shares within one run and is not cited as a speed figure.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_check import random_llama, sync  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.engine.batch_engine import BatchEngine  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402


def profile_steps(model: Any, device: torch.device, requests: int, steps: int) -> str:
    engine = BatchEngine(SpeculativeDecoder(model, None, parse_strategy("ar")), max_batch_size=requests)
    gen = torch.Generator().manual_seed(5)
    vocab = int(model.config.vocab_size)
    for _ in range(requests):
        engine.add_request(torch.randint(0, vocab, (64,), generator=gen).tolist(), SamplingParams(), 3 * steps + 20)
    for _ in range(5):
        engine.step()
    forward_s = [0.0]
    original = model.forward

    def timed_forward(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = original(*args, **kwargs)
        forward_s[0] += time.perf_counter() - start  # host time in the forward (launches), no device sync
        return out

    model.forward = timed_forward
    lines: list[str] = []
    try:
        sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync(device)
        plain = (time.perf_counter() - start) / steps
        lines.append(f"## {requests} request(s): step {plain * 1e3:.2f} ms, host time in model.forward "
                     f"{forward_s[0] / steps * 1e3:.2f} ms ({forward_s[0] / steps / plain:.0%})")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            engine.step()
        sync(device)
        profiler.disable()
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(35)
            lines += [f"### cProfile by {order}", text.getvalue()]
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(steps):
                engine.step()
            sync(device)
        lines += ["### torch ops by self CPU time",
                  prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)]
    finally:
        model.forward = original
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="135M")
    parser.add_argument("--requests", default="1,4")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_llama(args.shape, dtype, device, args.layers)
    with torch.inference_mode():
        report = "\n\n".join(profile_steps(model, device, int(r), args.steps) for r in args.requests.split(","))
    print(report)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"step_profile_{device.type}.txt").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
