"""The commit a benchmark ran at, for the provenance line of its results (no torch: start-up benches import it)."""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def git_commit(repo: str = ROOT) -> str:
    """Short hash of ``repo``'s HEAD (this checkout by default), or ``unknown`` outside a git checkout."""
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
