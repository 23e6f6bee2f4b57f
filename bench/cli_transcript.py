"""A new user's shell session on a fresh clone, recorded with timings: setup, first run (empty model
cache), second run, bad input, ``--json | python -m json.tool``, a prompt on stdin, ``| head -c 100``.

Each step runs in ``bash`` in the clone; the transcript shows the command, its stdout and stderr (long
outputs shortened), its exit status, the wall time and, for generation, the time to the first byte on
stdout. Setup runs ``scripts/setup.sh`` inside a virtual environment that sees the system's packages, so
that the machine's own editable install is left alone. Writes ``bench/results/cli_transcript.md``.

    git clone . /tmp/fresh && python bench/cli_transcript.py /tmp/fresh
"""

from __future__ import annotations

import argparse
import os
import platform
import select
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402

PROMPT = "Explain speculative decoding in one paragraph."


def run(command: str, cwd: str, env: dict[str, str]) -> tuple[str, str, int, float, float | None]:
    """``(stdout, stderr, status, seconds, seconds to the first stdout byte)`` of ``bash -c command``."""
    start = time.perf_counter()
    proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    first: float | None = None
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    while streams:
        ready, _, _ = select.select(list(streams), [], [])
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                del streams[fd]
                continue
            if fd == proc.stdout.fileno() and first is None:
                first = time.perf_counter() - start
            streams[fd].extend(chunk)
    status = proc.wait()
    return out.decode(errors="replace"), err.decode(errors="replace"), status, time.perf_counter() - start, first


def shorten(text: str, lines: int = 14) -> str:
    parts = text.rstrip("\n").splitlines()
    if len(parts) <= lines:
        return "\n".join(parts)
    return "\n".join(parts[: lines - 4] + [f"... ({len(parts) - lines + 1} lines left out) ..."] + parts[-3:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("clone", help="a fresh clone of the repository")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                       "cli_transcript.md"))
    args = parser.parse_args(argv)
    clone = os.path.abspath(args.clone)
    cache = tempfile.mkdtemp(prefix="spec-fast-cache-")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["SPEC_FAST_CACHE"] = cache
    venv_bin = os.path.join(clone, ".venv", "bin")
    env["PATH"] = venv_bin + os.pathsep + env["PATH"]
    commit = git_commit(clone)
    generate = f'python3 -m spec_fast generate "{PROMPT}" --max-new-tokens 64'
    steps = [
        ("setup (in a venv that sees the system's packages)",
         f"{sys.executable} -m venv --system-site-packages .venv && bash scripts/setup.sh"),
        ("--help", "python3 -m spec_fast generate --help | head -n 3"),
        ("first run (empty model cache)", generate),
        ("second run (model cache filled)", generate),
        ("bad input: a typo in --strategy", f'{generate} --strategy chian:2'),
        ("bad input: a model path that does not exist", f'{generate} --model ./SmolLM2'),
        ("bad input: a sampling value", f'{generate} --top-p 1.5'),
        ("--json | python -m json.tool",
         'python3 -m spec_fast generate "Name three colours." --max-new-tokens 16 --json | python3 -m json.tool'),
        ("prompt from stdin", 'echo "Name three colours." | python3 -m spec_fast generate --max-new-tokens 24'),
        ("stop string", 'python3 -m spec_fast generate "Count from 1 to 20, separated by commas." '
                        '--max-new-tokens 64 --stop "7"'),
        ("closed pipe", f'{generate} | head -c 100; statuses=("${{PIPESTATUS[@]}}"); echo; '
                        f'echo "exit statuses (spec-fast, head): ${{statuses[*]}}"'),
    ]
    load = os.getloadavg()
    lines = [
        "# `spec-fast` on a fresh clone: a shell transcript with timings",
        "",
        f"- command: `python bench/cli_transcript.py {args.clone}` (clone of commit {commit})",
        f"- hardware: {platform.machine()}, {os.cpu_count()} CPUs; load average at the start "
        f"{load[0]:.2f} (the machine is shared with other jobs: times are noisy)",
        f"- model cache: a fresh temporary folder (`SPEC_FAST_CACHE={cache}`)",
        "- 'first output' is the time from starting the command to the first byte on stdout",
        "",
    ]
    for title, command in steps:
        out, err, status, seconds, first = run(command, clone, env)
        timing = f"{seconds:.1f} s" + (f", first output after {first:.1f} s" if first is not None else "")
        print(f"{title}: status {status}, {timing}", flush=True)
        lines += [f"## {title}", "", "```console", f"$ {command}"]
        if out.strip():
            lines.append(shorten(out))
        if err.strip():
            lines += ["[stderr]", shorten(err)]
        lines += ["```", "", f"exit status {status}; {timing}", ""]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
