#!/usr/bin/env bash
# Create (or reuse) a virtualenv for one SGLang release, cached OUTSIDE the clone.
#
# Usage: ci/venv.sh SGLANG_VERSION      -> prints the venv directory on stdout
#
# The cache key hashes RECIPE, the dependency pins of pyproject.toml and the ci/substitutions.txt lines that
# apply to the release, so changing any of them builds a fresh venv instead of silently reusing a stale one.
# SGLang's own pins decide torch/triton (0.5.17 -> torch 2.11.0, 0.5.18 - 0.5.21 -> 2.13.0, 0.5.22+ -> 2.14.1).
# A release with a pin PyPI cannot install (ci/substitutions.txt) is installed in two steps: sglang without
# its dependencies, then its requirement list with the substitutions applied (torch as ===, the PyPI build),
# resolved by pip as one set.
# Either way the venv must then satisfy the release's whole dependency closure (ci/deps.py check).
set -euo pipefail
version="$1"
here="$(cd "$(dirname "$0")/.." && pwd)"
pins="$(python3 -c 'import sys,tomllib; p=tomllib.load(open(sys.argv[1],"rb"))["project"]; print(p["dependencies"], p["optional-dependencies"])' "$here/pyproject.toml")"
subs="$(python3 "$here/ci/deps.py" substitutions "$version")"
# Bump RECIPE when the install commands below change.
RECIPE=1
# TWO_STEP versions the two-step install below (only releases with substitutions use it).
TWO_STEP=2
key="$(echo "$RECIPE $version $pins${subs:+ two-step $TWO_STEP $subs}" | sha256sum | cut -c1-12)"
root="${SGLANG_DETSPEC_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sglang-detspec-ci}"
venv="$root/venv-sglang-$version-$key"
if [ ! -f "$venv/.complete" ]; then
  echo "[ci/venv.sh] building $venv (sglang==$version); this takes several minutes" >&2
  rm -rf "$venv"
  mkdir -p "$root"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  tools=("setuptools>=64" "pytest>=8" "pytest-xdist>=3" matplotlib)
  if [ -z "$subs" ]; then
    "$venv/bin/python" -m pip install "${tools[@]}" "sglang==$version" >&2
  else
    echo "[ci/venv.sh] substituting for sglang==$version: $subs" >&2
    "$venv/bin/python" -m pip install -q --no-deps "sglang==$version" packaging >&2
    "$venv/bin/python" "$here/ci/deps.py" requirements "$version" > "$venv/sglang-requirements.txt"
    "$venv/bin/python" -m pip install "${tools[@]}" -r "$venv/sglang-requirements.txt" >&2
  fi
  if ! "$venv/bin/python" "$here/ci/deps.py" check "$version" >&2; then
    echo "[ci/venv.sh] $venv does not satisfy sglang==$version's dependency closure" >&2
    exit 1
  fi
  touch "$venv/.complete"
fi
# The clone moves between CI runs: (re)install our package in place every time, it is cheap.
# setuptools >= 77 carries bdist_wheel (editable installs need it) and PEP 639 license strings;
# torch 2.11 (sglang 0.5.17) requires setuptools < 82.
"$venv/bin/python" -m pip install -q "setuptools>=77,<82" >&2
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$here" >&2
echo "$venv"
