#!/usr/bin/env bash
# Create (or reuse) an overlay of one SGLang release on top of another release's full venv.
#
# Usage: ci/overlay.sh SGLANG_VERSION BASE_VERSION   -> prints "BASE_VENV OVERLAY_DIR" on stdout
#
# Run with PYTHONPATH=OVERLAY_DIR and BASE_VENV/bin on PATH. The overlay holds sglang==SGLANG_VERSION and
# every package of its pinned dependency closure that the base venv does not satisfy (installed
# --no-deps --target, repeated until `ci/deps.py check` finds the closure satisfied, ci/substitutions.txt
# applied), so the environment meets the requirements a full install of that release would; a closure
# still unmet after that is an error, never a skip. Cached next to the venvs, keyed by RECIPE, the release,
# the base venv and the substitutions that apply.
set -euo pipefail
version="$1"
base_version="$2"
here="$(cd "$(dirname "$0")/.." && pwd)"
base="$(bash "$here/ci/venv.sh" "$base_version")"
# Bump RECIPE when the install commands below change.
RECIPE=1
subs="$(python3 "$here/ci/deps.py" substitutions "$version")"
key="$(echo "$RECIPE $version $(basename "$base") $subs" | sha256sum | cut -c1-12)"
root="$(dirname "$base")"
overlay="$root/overlay-sglang-$version-on-$base_version-$key"
py="$base/bin/python"
if [ ! -f "$overlay/.complete" ]; then
  echo "[ci/overlay.sh] building $overlay (sglang==$version over $(basename "$base"))" >&2
  rm -rf "$overlay"
  mkdir -p "$overlay"
  "$py" -m pip install -q --no-deps --upgrade --target "$overlay" "sglang==$version" >&2
  for round in 1 2 3 4; do
    mapfile -t missing < <(PYTHONPATH="$overlay" "$py" "$here/ci/deps.py" check "$version" --missing)
    [ "${#missing[@]}" -eq 0 ] && break
    echo "[ci/overlay.sh] round $round: ${missing[*]}" >&2
    "$py" -m pip install -q --no-deps --upgrade --target "$overlay" "${missing[@]}" >&2
  done
  if ! PYTHONPATH="$overlay" "$py" "$here/ci/deps.py" check "$version" >&2; then
    echo "[ci/overlay.sh] sglang==$version's dependency closure is still unmet over $(basename "$base")" >&2
    exit 1
  fi
  touch "$overlay/.complete"
fi
echo "$base $overlay"
