"""A fresh machine installs what CI tested: every dependency is pinned in scripts/constraints.txt, and
every install in the setup scripts is held to it (docs/testing.md section 5)."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from spec_fast._hf_compat import cache_keyword

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("fast", "test", "bench", "serve")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "scripts" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"constraints.txt: {line!r} is not an exact pin"
        assert _canonical(name) not in pins, f"constraints.txt pins {name} twice"
        pins[_canonical(name)] = version
    return pins


def _declared() -> list[Requirement]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in EXTRAS:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def test_every_declared_dependency_has_a_pin_inside_its_declared_range() -> None:
    pins = _pins()
    for requirement in _declared():
        name = _canonical(requirement.name)
        assert name in pins, f"{requirement.name} (pyproject.toml) has no pin in scripts/constraints.txt"
        assert Version(pins[name]) in requirement.specifier, (
            f"pin {name}=={pins[name]} lies outside pyproject.toml's {requirement}")


def test_every_pip_install_of_the_setup_scripts_uses_the_constraints() -> None:
    for script in ("setup.sh", "test_numpy_only.sh", "test_wheel.sh"):
        installs = [line for line in (ROOT / "scripts" / script).read_text().splitlines()
                    if "pip install" in line and not line.lstrip().startswith("#")]
        assert installs, script
        for line in installs:
            if line.rstrip().endswith("-e . >&2") and "--no-deps" in line:
                continue  # the project itself, without dependencies
            assert '-c "$CONSTRAINTS"' in line, f"{script}: {line.strip()!r} installs without the constraints"


@pytest.mark.skipif(os.environ.get("CI", "").lower() != "true",
                    reason="checks the environment that CI's scripts/setup.sh built")
def test_ci_environment_has_exactly_the_pinned_versions() -> None:
    for name, version in _pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # a platform-only dependency
        assert installed.split("+")[0] == version, f"{name} {installed} installed, {version} pinned"


def _old(input_ids: object = None, past_key_values: object = None) -> None: ...


def _new(input_ids: object = None, cache: object = None, **kwargs: object) -> None: ...


def test_the_cache_keyword_follows_the_signature() -> None:
    assert cache_keyword(_old) == "past_key_values"
    assert cache_keyword(_new) == "cache"
    assert cache_keyword(len) == "past_key_values"
