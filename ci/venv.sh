#!/usr/bin/env bash
# Create (or reuse) a virtualenv for one SGLang release, cached OUTSIDE the clone.
#
# Usage: ci/venv.sh SGLANG_VERSION      -> prints the venv directory on stdout
#
# The cache key hashes RECIPE and the dependency pins of pyproject.toml, so changing a pin or the
# recipe builds a fresh venv instead of silently reusing a stale one.  SGLang's
# own pins decide torch/triton (0.5.17 -> torch 2.11.0, 0.5.23 -> torch 2.14.1).
set -euo pipefail
version="$1"
here="$(cd "$(dirname "$0")/.." && pwd)"
pins="$(python3 -c 'import sys,tomllib; p=tomllib.load(open(sys.argv[1],"rb"))["project"]; print(p["dependencies"], p["optional-dependencies"])' "$here/pyproject.toml")"
# Bump RECIPE when the install commands below change.
RECIPE=1
key="$(echo "$RECIPE $version $pins" | sha256sum | cut -c1-12)"
root="${SGLANG_DETSPEC_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sglang-detspec-ci}"
venv="$root/venv-sglang-$version-$key"
if [ ! -f "$venv/.complete" ]; then
  echo "[ci/venv.sh] building $venv (sglang==$version); this takes several minutes" >&2
  rm -rf "$venv"
  mkdir -p "$root"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install "setuptools>=64" "sglang==$version" "pytest>=8" "pytest-xdist>=3" matplotlib >&2
  touch "$venv/.complete"
fi
# The clone moves between CI runs: (re)install our package in place every time, it is cheap.
# setuptools >= 77 carries bdist_wheel (editable installs need it) and PEP 639 license strings;
# torch 2.11 (sglang 0.5.17) requires setuptools < 82.
"$venv/bin/python" -m pip install -q "setuptools>=77,<82" >&2
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$here" >&2
echo "$venv"
