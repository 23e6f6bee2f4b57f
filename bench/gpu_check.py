"""GPU check: what the engine does on a CUDA device, measured on random-weight Llama-shaped models.

Needs nothing a bare CUDA machine with torch and transformers lacks: no network, no model files. Sections
(each guarded: one that fails is recorded with its error and the others still run):

1. ``device``: the GPU, torch and transformers versions.
2. ``bandwidth``: a device-to-device copy (bytes read + written per second), the floor every speed is held
   against: a pass must at least read every weight once, so ``weight bytes / bandwidth`` bounds a token's time.
3. ``pass_cost``: one target pass of the engine's own path (``TreeKVCache.forward``, timed by
   ``spec_fast.engine.batch_depth.measure_pass_cost``, what the ``cost`` depth policy measures) behind a 512-token context, per width (tokens verified per row: a chain, and a binary tree from 4 on) and batch size,
   on bfloat16 models shaped like SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B (random weights: speed does
   not depend on them).
4. ``verify_kernels``: one ``verify_tree`` call per method at batch 64, vocabularies 49152 and 128256, trees
   of 8, 32 and 64 slots (``bench/verify_kernels.py``'s workload; khisti at 8 slots only: its LPs run on the host).
5. ``greedy``: greedy speculative decoding equals plain decoding and HF ``generate`` token for token, in
   float32, on the 135M shape (weights drawn with std 0.1 so the logits spread like a trained model's; the
   smallest top-1/top-2 logit gap met is reported, since a near-tie is where float32 sums in another order
   could flip an argmax).
6. ``host_reads``: host reads of device values per decoding step (``item``/``tolist``/``bool``/... counted as
   in ``tests/engine/test_host_syncs.py``) and, on CUDA, the synchronising operations torch's sync debug
   mode reports: each is a point where the GPU idles while the host catches up.
7. ``batch_engine``: plain continuous-batched decoding through :class:`spec_fast.BatchEngine` with 1 to 64
   concurrent requests on the 135M and 1B shapes: aggregate tokens/s against the bandwidth floor, and the
   step time beside the bare pass cost (the difference is the engine's host-side overhead per step).

Usage: ``python bench/gpu_check.py [--out bench/results/gpu/gpu_check] [--device cuda] [--quick]``;
``--quick --device cpu`` is a dry run on two-layer models (checks the script, measures nothing of note).
``scripts/gpu_check.sh`` runs it after the CUDA-marked tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import torch

from bench._git import git_commit
from bench.verify_kernels import METHOD_CONFIGS, Workload, label, sync, time_fast
from spec_fast.engine.batch_engine import BatchEngine
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.dual import DualDrafter
from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.engine.batch_depth import measure_pass_cost
from spec_fast.strategies import parse_strategy
from tests.engine.test_host_syncs import counting_reads

RESULTS = Path(__file__).resolve().parent / "results" / "gpu"  # one folder per card: h100/, h200/
#: public architecture numbers of the models whose shapes the random-weight models take
SHAPES: dict[str, dict[str, Any]] = {
    "135M": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),  # SmolLM2-135M
    "1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),  # Llama-3.2-1B
    "8B": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),  # Llama-3.1-8B
}
CONTEXT = 512


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def random_llama(shape: str, dtype: torch.dtype, device: torch.device, layers: int | None = None,
                 init_std: float = 0.02, seed: int = 0) -> Any:
    """A random-weight Llama of ``shape``, built directly on ``device`` in ``dtype`` (an 8B model never
    passes through host memory)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = dict(SHAPES[shape])
    if layers is not None:
        sizes["num_hidden_layers"] = layers
    config = LlamaConfig(**sizes, initializer_range=init_std, max_position_embeddings=4096,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with default_dtype(dtype), device:
        model = LlamaForCausalLM(config)
    return model.eval().requires_grad_(False)


def weight_bytes_per_token(model: Any) -> int:
    """Bytes a pass must read: every weight once; an untied input embedding only by the rows it looks up."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    if embed is not model.get_output_embeddings().weight:
        total -= embed.numel() * embed.element_size()
    return int(total)


def timed(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ sections
def device_section(device: torch.device) -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "transformers": transformers.__version__,
                            "python": platform.python_version(), "host_cpus": os.cpu_count()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda)
    else:
        info["name"] = platform.processor() or platform.machine()
    return info


def bandwidth_section(device: torch.device, quick: bool) -> dict[str, Any]:
    numel = (2**24 if quick else 2**29)  # 64 MiB or 2 GiB of float32
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device, warmup=2, repeats=10)
    moved = 2 * src.numel() * src.element_size()  # read + written
    return {"bytes_per_copy": moved, "seconds": seconds, "bytes_per_s": moved / seconds}


def pass_costs(model: Any, device: torch.device, batch: int, widths: list[int], tree: bool, repeats: int
               ) -> dict[int, float]:
    """Seconds of one engine target pass per width (``spec_fast.engine.batch_depth.measure_pass_cost``, what the
    ``cost`` depth policy measures: ``TreeKVCache.forward`` of ``width`` entries per row, chain or binary tree,
    behind a ``CONTEXT``-token context)."""
    with torch.inference_mode():
        cost = measure_pass_cost(model, device, rows=(batch,), tokens=widths, context=CONTEXT, repeats=repeats,
                                 tree=tree)
    return {width: cost.seconds[(batch, width)] for width in widths}


def pass_cost_section(device: torch.device, dtype: torch.dtype, shapes: list[str], layers: int | None,
                      bandwidth: float, quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    widths = [1, 2, 4, 8] if quick else [1, 2, 4, 8, 16, 32, 64]
    batched = [(4, [1, 4])] if quick else [(16, [1, 4, 16]), (64, [1, 4, 16])]
    for shape in shapes:
        model = random_llama(shape, dtype, device, layers)
        weight_bytes = weight_bytes_per_token(model)
        floor = weight_bytes / bandwidth
        groups = [(1, widths, False), (1, [w for w in widths if w >= 4], True)]
        groups += [(b, ws, False) for b, ws in batched]
        grid = [(batch, width, tree, seconds) for batch, ws, tree in groups
                for width, seconds in pass_costs(model, device, batch, ws, tree, 5 if quick else 10).items()]
        for batch, width, tree, seconds in grid:
            rows.append({"shape": shape, "batch": batch, "width": width, "tree": tree, "pass_ms": seconds * 1e3,
                         "weight_bytes": weight_bytes, "floor_ms": floor * 1e3, "floor_share": floor / seconds,
                         "tokens_per_s": batch * width / seconds})
            print(f"pass_cost {shape} B={batch} W={width} {'tree' if tree else 'chain'}: {seconds * 1e3:.2f} ms "
                  f"(floor {floor * 1e3:.2f} ms)", file=sys.stderr)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def verify_section(device: torch.device, quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    batch = 8 if quick else 64
    grid = [(4096, 8)] if quick else [(v, n) for v in (49152, 128256) for n in (8, 32, 64)]
    for vocab, slots in grid:
        work = Workload(vocab, slots, batch, seed=vocab + slots, device=device)
        for method, options in METHOD_CONFIGS:
            if method == "khisti" and slots > 8:
                # its pair LPs are solved on the host (HiGHS, as in spec_ref): seconds per call at 32 and 64
                # slots on an H200's host, measured once (bench/results/gpu), and the same on any GPU
                continue
            seconds, mean_tau = time_fast(work, method, options, batch, repeats=3 if quick else 5)
            rows.append({"method": label(method, options), "V": vocab, "N": slots, "B": batch,
                         "call_ms": seconds * 1e3, "us_per_row": seconds * 1e6 / batch, "mean_tau": float(mean_tau)})
    return rows


def _greedy_prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (16, 40, 7, 100)]


def greedy_section(device: torch.device, layers: int | None, quick: bool) -> list[dict[str, Any]]:
    target = random_llama("135M", torch.float32, device, layers, init_std=0.1, seed=1)
    vocab = int(target.config.vocab_size)
    prompts = _greedy_prompts(vocab)
    new = 16 if quick else 48
    plain = SpeculativeDecoder(target, None, parse_strategy("ar")).generate(prompts, new).tokens
    hf = []
    gaps = []
    with torch.inference_mode():
        for prompt in prompts:
            out = target.generate(torch.tensor([prompt], device=device), max_new_tokens=new, min_new_tokens=new,
                                  do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True,
                                  return_dict_in_generate=True)
            hf.append(out.sequences[0, len(prompt):].tolist())
            top2 = torch.stack(out.logits).float().topk(2, dim=-1).values  # [new, 1, 2]
            gaps.append(float((top2[..., 0] - top2[..., 1]).min()))
    rows: list[dict[str, Any]] = [{"strategy": "ar", "draft": "-", "equal_to_plain": True,
                                   "equal_to_hf_generate": plain == hf, "min_top2_logit_gap": min(gaps)}]
    half = max(1, int(target.config.num_hidden_layers) // 4)
    cases = [("chain:4", "self"), ("chain:4", f"early-exit-{half}"), ("iid:2x3", f"early-exit-{half}"),
             ("delayed:2,1,2", f"early-exit-{half}"), ("topk:3,2,6", f"early-exit-{half}"),
             ("dynatree", f"early-exit-{half}"), ("chain:3", "dual-merge"), ("chain:3", "dual-route")]
    for strategy, draft in cases:
        drafter: Any
        if draft == "self":  # the target drafts for itself: every greedy draft token is accepted
            drafter = ModelDrafter(target)
        elif draft.startswith("dual"):
            drafter = DualDrafter(ModelDrafter(target), EarlyExitDrafter(target, half), draft.split("-")[1])
        else:
            drafter = EarlyExitDrafter(target, half)
        result = SpeculativeDecoder(target, drafter, parse_strategy(strategy)).generate(prompts, new)
        mismatched = [i for i, (a, b) in enumerate(zip(result.tokens, plain)) if a != b]
        rows.append({"strategy": strategy, "draft": draft, "equal_to_plain": not mismatched,
                     "rows_differing": mismatched, "tokens_per_pass": result.metrics.block_efficiency,
                     "target_passes": result.metrics.target_passes})
        print(f"greedy {strategy} {draft}: equal={not mismatched}", file=sys.stderr)
    return rows


@contextmanager
def counting_syncs(device: torch.device) -> Iterator[list[int]]:
    """Synchronising CUDA operations, as torch's sync debug mode reports them (always 0 off CUDA)."""
    count = [0]
    if device.type != "cuda":
        yield count
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield count
        finally:
            torch.cuda.set_sync_debug_mode("default")
            count[0] = sum("synchroniz" in str(w.message) for w in caught)


def host_reads_section(device: torch.device, layers: int | None) -> list[dict[str, Any]]:
    target = random_llama("135M", torch.float32, device, layers, init_std=0.1, seed=1)
    half = max(1, int(target.config.num_hidden_layers) // 4)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    rows: list[dict[str, Any]] = []
    for strategy, draft in [("ar", None), ("chain:4", "early-exit"), ("topk:3,2,5", "early-exit"),
                            ("iid:2x3", "early-exit"), ("chain:3", "dual-merge")]:
        drafter: Any = None
        if draft == "early-exit":
            drafter = EarlyExitDrafter(target, half)
        elif draft == "dual-merge":
            drafter = DualDrafter(ModelDrafter(target), EarlyExitDrafter(target, half), "merge")
        decoder = SpeculativeDecoder(target, drafter, parse_strategy(strategy))
        runs = []
        for new in (8, 24):
            with counting_reads() as reads, counting_syncs(device) as syncs:
                result = decoder.generate(prompts, max_new_tokens=new)
            runs.append((reads[0], syncs[0], result.metrics.target_passes))
        (reads_a, syncs_a, steps_a), (reads_b, syncs_b, steps_b) = runs
        steps = max(1, steps_b - steps_a)
        rows.append({"strategy": strategy, "draft": draft or "-", "host_reads_per_step": (reads_b - reads_a) / steps,
                     "syncs_per_step": (syncs_b - syncs_a) / steps if device.type == "cuda" else None})
    return rows


def batch_engine_section(device: torch.device, dtype: torch.dtype, shapes: list[str], layers: int | None,
                         bandwidth: float, quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    levels = [1, 4] if quick else [1, 4, 16, 64]
    new = 16 if quick else 64
    for shape in shapes:
        model = random_llama(shape, dtype, device, layers)
        floor = weight_bytes_per_token(model) / bandwidth
        vocab = int(model.config.vocab_size)
        gen = torch.Generator().manual_seed(5)
        for requests in levels:
            engine = BatchEngine(SpeculativeDecoder(model, None, parse_strategy("ar")), max_batch_size=requests)
            prompts = [torch.randint(0, vocab, (64,), generator=gen).tolist() for _ in range(requests)]
            for prompt in prompts[:1]:  # warm-up: one short request
                engine.add_request(prompt, SamplingParams(), 4)
            for _ in range(10):
                if not engine.has_unfinished():
                    break
                engine.step()
            for prompt in prompts:
                engine.add_request(prompt, SamplingParams(), new)
            emitted, steps = 0, 0
            sync(device)
            start = time.perf_counter()
            while engine.has_unfinished() and steps < 10 * new:  # bounded: plain decoding ends in ~new steps
                emitted += sum(len(out.new_tokens) for out in engine.step())
                steps += 1
            sync(device)
            seconds = time.perf_counter() - start
            bare = pass_costs(model, device, requests, [1], False, repeats=5)[1]
            step_s = seconds / max(1, steps)
            rows.append({"shape": shape, "requests": requests, "tokens": emitted, "steps": steps, "seconds": seconds,
                         "tokens_per_s": emitted / seconds, "step_ms": step_s * 1e3, "bare_pass_ms": bare * 1e3,
                         "floor_ms": floor * 1e3, "host_overhead_share": max(0.0, 1 - bare / step_s)})
            print(f"batch_engine {shape} R={requests}: {emitted / seconds:.0f} tok/s", file=sys.stderr)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------------ report
def _greedy_note(row: dict[str, Any]) -> str:
    if "equal_to_hf_generate" in row:  # the plain row: checked against HF generate, with the closest call met
        return (f"equal to HF generate: {row['equal_to_hf_generate']}, min top-2 logit gap "
                f"{row['min_top2_logit_gap']:.2g}")
    return f"rows differing: {row.get('rows_differing', [])}"


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = ["# GPU check: the engine on a CUDA device", "", *(f"- {k}: {v}" for k, v in meta.items()), ""]
    dev = report.get("device")
    if isinstance(dev, dict):
        lines += ["## Device", "", *(f"- {k}: {v}" for k, v in dev.items()), ""]
    bw = report.get("bandwidth")
    if isinstance(bw, dict) and "bytes_per_s" in bw:
        lines += ["## Memory bandwidth (the floor)", "",
                  f"Device-to-device copy: {bw['bytes_per_s'] / 1e9:.0f} GB/s (bytes read + written). A token's "
                  "floor below is the model's weight bytes over this figure.", ""]
    for name, title, header, fmt in [
        ("pass_cost", "Target pass cost (engine path, 512-token context, bfloat16)",
         "| shape | batch | width | tree | pass (ms) | floor (ms) | floor share | tokens/s |",
         lambda r: f"| {r['shape']} | {r['batch']} | {r['width']} | {'tree' if r['tree'] else 'chain'} | "
                   f"{r['pass_ms']:.2f} | {r['floor_ms']:.2f} | {r['floor_share']:.1%} | {r['tokens_per_s']:.0f} |"),
        ("verify_kernels", "Verification kernels (one verify_tree call)",
         "| method | V | N | B | call (ms) | per row (us) | mean accepted |",
         lambda r: f"| {r['method']} | {r['V']} | {r['N']} | {r['B']} | {r['call_ms']:.3f} | {r['us_per_row']:.1f} | "
                   f"{r['mean_tau']:.2f} |"),
        ("greedy", "Greedy speculative = plain decoding (float32, 135M shape, weights std 0.1)",
         "| strategy | draft | equal to plain | other | tokens per pass |",
         lambda r: f"| {r['strategy']} | {r['draft']} | {r['equal_to_plain']} | {_greedy_note(r)} | "
                   f"{r.get('tokens_per_pass', 1.0):.2f} |"),
        ("host_reads", "Host reads and synchronisations per decoding step (135M shape, batch 2)",
         "| strategy | draft | host reads / step | synchronising ops / step |",
         lambda r: f"| {r['strategy']} | {r['draft']} | {r['host_reads_per_step']:.2f} | "
                   f"{'-' if r['syncs_per_step'] is None else format(r['syncs_per_step'], '.2f')} |"),
        ("batch_engine", "Continuous batching (BatchEngine, plain decoding, bfloat16, 64-token prompts)",
         "| shape | requests | tokens/s | step (ms) | bare pass (ms) | host overhead | floor (ms) |",
         lambda r: f"| {r['shape']} | {r['requests']} | {r['tokens_per_s']:.0f} | {r['step_ms']:.2f} | "
                   f"{r['bare_pass_ms']:.2f} | {r['host_overhead_share']:.0%} | {r['floor_ms']:.2f} |"),
    ]:
        section = report.get(name)
        lines += [f"## {title}", ""]
        if isinstance(section, list):
            lines += [header, "|" + "---|" * (header.count("|") - 1), *(fmt(r) for r in section), ""]
        elif isinstance(section, dict) and "error" in section:
            lines += [f"Failed: `{section['error']}`", ""]
        else:
            lines += ["Not run.", ""]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    rows = [r for r in report.get("pass_cost") or [] if isinstance(r, dict) and r["batch"] == 1]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for tree, style in ((False, "-o"), (True, "--s")):
            pts = [(r["width"], r["pass_ms"]) for r in rows if r["shape"] == shape and r["tree"] == tree]
            if pts:
                ax.plot(*zip(*pts), style, label=f"{shape} {'tree' if tree else 'chain'}")
        floor = next(r["floor_ms"] for r in rows if r["shape"] == shape)
        ax.axhline(floor, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens verified per pass (width)")
    ax.set_ylabel("pass time (ms), dotted: bandwidth floor")
    ax.set_title(f"Target pass cost on {report.get('device', {}).get('name', '?')}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "gpu_check"), help="result file stem (.json/.md/.png)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="two-layer models, small grids (a dry run)")
    parser.add_argument("--shapes", default="135M,1B,8B", help="comma-separated, from " + ",".join(SHAPES))
    parser.add_argument("--sections", default="pass_cost,verify_kernels,greedy,host_reads,batch_engine")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible to torch (use --device cpu --quick for a dry run)", file=sys.stderr)
        return 2
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        print(f"gpu_check: unknown --shapes {unknown}, expected some of {list(SHAPES)}", file=sys.stderr)
        return 2
    layers = 2 if args.quick else None
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 in the greedy check
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"meta": {
        "command": "python bench/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": os.environ.get("SPEC_VERIFY_COMMIT") or git_commit(), "quick": args.quick,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}}

    def run(name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as error:  # a failed section is part of the report; the others still run
            traceback.print_exc()
            report[name] = {"error": f"{type(error).__name__}: {error}".splitlines()[0][:300]}
        report["meta"][f"{name}_s"] = round(time.perf_counter() - start, 1)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1))  # kept as it grows
        return report[name]

    run("device", lambda: device_section(device))
    bandwidth = run("bandwidth", lambda: bandwidth_section(device, args.quick)).get("bytes_per_s", float("nan"))
    wanted = set(args.sections.split(","))
    dtype = torch.bfloat16
    if "pass_cost" in wanted:
        run("pass_cost", lambda: pass_cost_section(device, dtype, shapes, layers, bandwidth, args.quick))
    if "verify_kernels" in wanted:
        run("verify_kernels", lambda: verify_section(device, args.quick))
    if "greedy" in wanted:
        run("greedy", lambda: greedy_section(device, layers, args.quick))
    if "host_reads" in wanted:
        run("host_reads", lambda: host_reads_section(device, layers))
    if "batch_engine" in wanted:
        run("batch_engine", lambda: batch_engine_section(device, dtype, [s for s in shapes if s != "8B"], layers,
                                                         bandwidth, args.quick))
    out.with_suffix(".md").write_text(markdown(report))
    try:
        plot(report, out.with_suffix(".png"))
    except ImportError:
        pass
    print(markdown(report))
    failed = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
