"""The supported SGLang range is defined once (integration/compat.py); pyproject.toml's dependency and the release
list CI tests (.ci/run) must say the same, so a release added in one place cannot silently miss the others."""

import re
from pathlib import Path

import pytest

from sglang_detspec.integration import compat

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[3]


def _patch_releases():
    (major, minor, lo), (hi_major, hi_minor, hi) = compat.SUPPORTED_MIN, compat.SUPPORTED_MAX
    assert (major, minor) == (hi_major, hi_minor), "the range spans one minor release; extend this test if not"
    return [f"{major}.{minor}.{p}" for p in range(lo, hi + 1)]


def test_pyproject_dependency_is_the_supported_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(r"sglang\b", d)]
    major, minor, hi = compat.SUPPORTED_MAX
    assert spec.replace(" ", "") == (
        f"sglang>={'.'.join(map(str, compat.SUPPORTED_MIN))},<{major}.{minor}.{hi + 1}"
    ), spec


def test_ci_tests_every_release_of_the_range():
    ci = (ROOT / ".ci" / "run").read_text()
    default = re.search(r'versions="\$\{SGLANG_DETSPEC_CI_VERSIONS:-([^}]*)\}"', ci)
    assert default, "no default release list in .ci/run"
    assert default.group(1).split() == _patch_releases()
    table = dict(re.findall(r"\[(\d+\.\d+\.\d+)\]=(\S+?)[\s)]", ci.split("declare -A base=", 1)[1].split("\n", 1)[0]))
    assert sorted(table, key=lambda v: tuple(map(int, v.split(".")))) == _patch_releases(), table

