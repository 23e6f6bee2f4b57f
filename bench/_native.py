"""Native anchors for bench/peers.py: llama.cpp's own programs built from source, and the memory-bandwidth floor.

* :class:`NativeLlama` runs the programs ``scripts/build_llama_cpp.sh`` builds into ``BIN`` (default
  ``${TMPDIR:-/tmp}/llama-cpp-build/build/bin``; ``SPEC_VERIFY_LLAMA_CPP_BIN`` or ``--llama-cpp-bin`` moves it):
  ``llama-decode`` (``bench/native/llama_decode.c``: plain decoding over libllama, our prompt's token ids in,
  prefill and decode timed apart), ``llama-lookup`` (llama.cpp's prompt-lookup speculative decoding),
  ``llama-bench`` (``tg``/``pp`` rates) and ``llama-quantize`` (the Q8_0 re-quantisation).
* :func:`bandwidth_floor` measures the read bandwidth (``bench/native/read_bandwidth.c``, compiled here on
  first use) and divides the bytes a token's pass must read (every tensor of the GGUF file: the embedding doubles
  as the LM head, so it is read whole) by it.

Every native program runs with weight repacking off (``use_extra_bufts = false``, llama.cpp's ``--no-repack``):
with it, ggml's AMX path crashed on this file on the benchmark machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BIN = os.environ.get("SPEC_VERIFY_LLAMA_CPP_BIN",
                             os.path.join(os.environ.get("TMPDIR", "/tmp"), "llama-cpp-build", "build", "bin"))
#: every native call is bounded: a hung program fails the run instead of stalling it
TIMEOUT_S = 600


@dataclass(frozen=True)
class NativeRun:
    """One native reply: its tokens (``llama-decode``; ``llama-lookup`` reports a count only), the prompt's
    prefill, the first token's and the whole reply's seconds, and llama-lookup's draft statistics."""

    tokens: list[int]
    count: int
    first_seconds: float
    seconds: float
    drafted: int = 0
    accepted: int = 0


class NativeLlama:
    """The native programs in ``bin_dir`` (``ValueError`` naming the missing ones and the build command)."""

    def __init__(self, bin_dir: str = DEFAULT_BIN, need: tuple[str, ...] = ("llama-decode",)) -> None:
        self.bin_dir = bin_dir
        missing = [p for p in need if not os.access(os.path.join(bin_dir, p), os.X_OK)]
        if missing:
            raise ValueError(f"native llama.cpp programs missing in {bin_dir}: {', '.join(missing)} "
                             f"(build them: bash scripts/build_llama_cpp.sh {os.path.dirname(bin_dir.rstrip('/'))})")

    def path(self, program: str) -> str:
        return os.path.join(self.bin_dir, program)

    def run(self, program: str, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``program`` of ``bin_dir`` with ``args`` (text in and out, bounded by ``TIMEOUT_S``); a
        RuntimeError with the end of its stderr where it fails."""
        out = subprocess.run([self.path(program), *args], input=stdin, capture_output=True, text=True,
                             timeout=TIMEOUT_S, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{program} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
        return out

    def decode(self, gguf: str, prompt: list[int], threads: int, new: int, temperature: float, seed: int
               ) -> NativeRun:
        """Plain decoding of ``prompt`` (token ids) by ``llama-decode``."""
        out = self.run("llama-decode", [gguf, str(threads), str(new), f"{temperature:g}", str(seed)],
                       " ".join(map(str, prompt)))
        result = json.loads(out.stdout)
        tokens = [int(t) for t in result["tokens"]]
        return NativeRun(tokens, len(tokens), float(result["first_s"]), float(result["total_s"]))

    def lookup(self, gguf: str, prompt_text: str, threads: int, new: int, draft_max: int) -> NativeRun:
        """Greedy prompt-lookup decoding of ``prompt_text`` by ``llama-lookup`` (its own tokenizer; it reports
        the prompt's encoding and the decoding apart, and counts its drafts)."""
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
            fh.write(prompt_text)
            prompt_file = fh.name
        try:
            out = self.run("llama-lookup", ["-m", gguf, "-t", str(threads), "-tb", str(threads), "-n", str(new),
                                            "--spec-draft-n-max", str(draft_max), "-f", prompt_file, "--temp", "0",
                                            "-c", "4096", "-b", "4096", "-ub", "4096", "-nr"])
        finally:
            os.unlink(prompt_file)
        text = out.stderr + out.stdout
        encoded = re.search(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
        decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
        drafted = re.search(r"n_drafted\s+=\s+(\d+)", text)
        accepted = re.search(r"n_accept\s+=\s+(\d+)", text)
        if not (encoded and decoded and drafted and accepted):
            raise RuntimeError(f"llama-lookup printed no timings: {text.strip()[-400:]}")
        prefill, count, decode = float(encoded.group(2)), int(decoded.group(1)), float(decoded.group(2))
        # its decode clock starts after the prompt's batch, whose sampled token is the reply's first
        return NativeRun([], count, prefill, prefill + decode, int(drafted.group(1)), int(accepted.group(1)))

    def bench(self, gguf: str, threads: int, tokens: int = 128, prompt: int = 128, repetitions: int = 3
              ) -> dict[str, float]:
        """``llama-bench``'s ``tg<tokens>`` and ``pp<prompt>`` rates (tokens/s, mean over repetitions)."""
        out = self.run("llama-bench", ["-m", gguf, "-t", str(threads), "-n", str(tokens), "-p", str(prompt), "-r",
                                       str(repetitions), "--repack", "0", "-o", "json"])
        rates: dict[str, float] = {}
        for entry in json.loads(out.stdout):
            key = f"tg{entry['n_gen']}" if entry["n_gen"] else f"pp{entry['n_prompt']}"
            rates[key] = float(entry["avg_ts"])
        return rates

    def requantize(self, gguf: str, kind: str, folder: str) -> str:
        """``gguf`` re-quantised to ``kind`` (e.g. ``Q8_0``) by ``llama-quantize`` into ``folder`` (kept: made once)."""
        target = os.path.join(folder, os.path.basename(gguf).rsplit(".", 2)[0] + f".{kind}.gguf")
        if not os.path.isfile(target):
            self.run("llama-quantize", ["--allow-requantize", gguf, target, kind])
        return target


def weight_bytes(gguf: str) -> int:
    """Bytes of every tensor in ``gguf``: what one token's pass reads (the tied embedding is the LM head)."""
    from spec_fast.lean.gguf_file import read_gguf_file

    return sum(int(t.data.nbytes) for t in read_gguf_file(gguf).tensors)


def read_bandwidth(threads: int, mib: int = 1024) -> float:
    """Bytes/s of the best of 9 reads of ``mib`` MiB by ``threads`` threads (``bench/native/read_bandwidth.c``,
    compiled with the machine's C compiler into a temporary folder on each call)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) to build bench/native/read_bandwidth.c")
    with tempfile.TemporaryDirectory() as folder:
        binary = os.path.join(folder, "read_bandwidth")
        subprocess.run([compiler, "-O3", "-march=native", "-fopenmp", os.path.join(HERE, "native", "read_bandwidth.c"),
                        "-o", binary], check=True, capture_output=True, timeout=120)
        out = subprocess.run([binary, str(threads), str(mib)], capture_output=True, text=True, check=True,
                             timeout=TIMEOUT_S)
    return float(json.loads(out.stdout)["bytes_per_s"])


def bandwidth_floor(gguf: str, threads: int) -> dict[str, Any]:
    """The speed floor of plain decoding ``gguf`` at ``threads``: bytes per token, the read bandwidth, and the
    fewest milliseconds (most tokens/s) a pass could take.

    The bandwidth is measured on a buffer the size of the weights, read over and over as decoding reads them:
    on a machine whose last-level cache is large (480 MiB on the benchmark machine, shared with its other
    tenants) part of a 100 MB model can stay cached between tokens, which a 1 GiB buffer would not show (it
    read about 15 GB/s there against about 25 GB/s for a model-sized one). The 1 GiB figure is recorded too."""
    size = weight_bytes(gguf)
    bandwidth = read_bandwidth(threads, max(64, -(-size // 2**20)))
    return {"threads": threads, "bytes_per_token": size, "read_bytes_per_s": bandwidth,
            "read_bytes_per_s_1gib": read_bandwidth(threads, 1024),
            "floor_ms_per_token": 1000 * size / bandwidth, "floor_tokens_per_s": bandwidth / size}
