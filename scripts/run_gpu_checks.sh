#!/usr/bin/env bash
# Run everything that needs a CUDA GPU, on any CUDA machine where sglang is installed normally.
#
#   scripts/run_gpu_checks.sh OUTDIR [--only PART[,PART...]] [--quick] [--pytest-args "ARGS"]
#                             [--kernel-args "ARGS"] [--bench-args "ARGS"] [--e2e-tests "PATHS"]
#
# PART is one of:
#   unit    GPU unit tests:        python -m pytest -m gpu tests/unit tests/gpu
#   kernel  kernel GPU checks:     python scripts/gpu_kernel_checks.py --out OUTDIR
#   bench   sampler benchmark:     python scripts/bench/bench_sampler.py --out OUTDIR   (CSV/PNG in OUTDIR),
#           then the verify-scheme benchmark: scripts/bench/bench_verify_schemes.py --out OUTDIR (log: bench_verify.log)
#   e2e     end-to-end tests:      python -m pytest tests/e2e  (real sglang servers on the tiny models;
#                                   results in OUTDIR/e2e/e2e_results.json, server logs beside it)
# --kernel-args "ARGS" goes to gpu_kernel_checks.py (e.g. "--only coupled"), --bench-args "ARGS" to
# bench_verify_schemes.py (e.g. "--coupled-launches 1024x4,2048x8"); --e2e-tests "PATHS" replaces tests/e2e.
# On the lent H200, `source scripts/gpu_stage.sh` first (it stages SGLang from .gpu-bundle).
# Default: all four, in that order. Each part's output goes to OUTDIR/<part>.log; the script goes on
# after a failing part and exits non-zero if any part failed. --pytest-args is passed to the e2e
# pytest run (e.g. "-k builtin" to run only the baseline); --quick passes --quick to the kernel checks
# and the benchmark (a smoke run). Python: $PYTHON, else python3. One part at a time fits a 10-minute
# budget: e2e starts its servers side by side (~2-3 min on an H200), kernel/bench with --quick.
#
# The plugin must be installed (pip install -e .) in that Python so that SGLang's plugin loader sees
# its entry point; the e2e part checks this. Nothing here downloads anything: the tiny models are
# built locally (sglang_detspec.models.tiny_models: the weighted pair by default, DETSPEC_E2E_PAIR=dummy for the other).
set -uo pipefail

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage; exit 2; }
case "$1" in -h|--help) usage; exit 0;; esac
OUTDIR=$1; shift
ONLY="unit,kernel,bench,e2e"
PYTEST_ARGS=""
KERNEL_ARGS=""
BENCH_ARGS=""
E2E_TESTS="tests/e2e"
QUICK=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift 2;;
    --only=*) ONLY=${1#--only=}; shift;;
    --quick) QUICK=(--quick); shift;;
    --pytest-args) PYTEST_ARGS=$2; shift 2;;
    --pytest-args=*) PYTEST_ARGS=${1#--pytest-args=}; shift;;
    --kernel-args) KERNEL_ARGS=$2; shift 2;;
    --kernel-args=*) KERNEL_ARGS=${1#--kernel-args=}; shift;;
    --bench-args) BENCH_ARGS=$2; shift 2;;
    --bench-args=*) BENCH_ARGS=${1#--bench-args=}; shift;;
    --e2e-tests) E2E_TESTS=$2; shift 2;;
    --e2e-tests=*) E2E_TESTS=${1#--e2e-tests=}; shift;;
    *) echo "unknown argument: $1" >&2; usage; exit 2;;
  esac
done
for p in ${ONLY//,/ }; do
  case "$p" in unit|kernel|bench|e2e) ;; *) echo "unknown part '$p' (unit, kernel, bench, e2e)" >&2; exit 2;; esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# The real Triton compiler, never the interpreter, on a GPU machine.
unset TRITON_INTERPRET

"$PY" - <<'PYEOF' || exit 2
import importlib.util, sys
try:
    import torch
except ImportError:
    sys.exit("run_gpu_checks.sh: torch is not importable by this python")
if not torch.cuda.is_available():
    sys.exit("run_gpu_checks.sh: no CUDA GPU visible to torch")
print(f"torch {torch.__version__}, GPU: {torch.cuda.get_device_name(0)}")
if importlib.util.find_spec("sglang") is None:
    sys.exit("run_gpu_checks.sh: sglang is not importable by this python (pip install sglang, or stage a runtime)")
from importlib.metadata import entry_points
eps = [e.name for e in entry_points(group="sglang.srt.plugins")]
print("sglang.srt.plugins entry points:", eps or "none (pip install -e . to register sglang-detspec)")
PYEOF

declare -A RC
run_part() {  # name, command...
  local name=$1; shift
  echo "=== [$name] $* ===" | tee "$OUTDIR/$name.log"
  local t0=$SECONDS
  "$@" 2>&1 | tee -a "$OUTDIR/$name.log"
  RC[$name]=${PIPESTATUS[0]}
  echo "=== [$name] exit ${RC[$name]} after $((SECONDS - t0)) s ===" | tee -a "$OUTDIR/$name.log"
}

for p in ${ONLY//,/ }; do
  case "$p" in
    unit)
      run_part unit "$PY" -m pytest -m gpu tests/unit tests/gpu -q -rs -p no:cacheprovider;;
    kernel)
      if [ -f scripts/gpu_kernel_checks.py ]; then
        # shellcheck disable=SC2086
        run_part kernel "$PY" scripts/gpu_kernel_checks.py --out "$OUTDIR" ${QUICK[@]+"${QUICK[@]}"} $KERNEL_ARGS
      else
        echo "scripts/gpu_kernel_checks.py not found" | tee "$OUTDIR/kernel.log"; RC[kernel]=1
      fi;;
    bench)
      run_part bench "$PY" scripts/bench/bench_sampler.py --out "$OUTDIR" ${QUICK[@]+"${QUICK[@]}"}
      bench_rc=${RC[bench]}
      # shellcheck disable=SC2086
      run_part bench_verify "$PY" scripts/bench/bench_verify_schemes.py --out "$OUTDIR" ${QUICK[@]+"${QUICK[@]}"} \
        $BENCH_ARGS
      RC[bench]=$(( bench_rc || RC[bench_verify] ));;
    e2e)
      mkdir -p "$OUTDIR/e2e"
      # shellcheck disable=SC2086
      DETSPEC_E2E_OUT="$OUTDIR/e2e" run_part e2e "$PY" -m pytest $E2E_TESTS -v -s -rs -p no:cacheprovider $PYTEST_ARGS
      if [ -f "$OUTDIR/e2e/e2e_results.json" ]; then
        "$PY" - "$OUTDIR/e2e/e2e_results.json" <<'PYEOF' | tee -a "$OUTDIR/e2e.log"
import json, sys
d = json.load(open(sys.argv[1]))
print("e2e results:")
for k in sorted(d):
    v = d[k]
    if isinstance(v, dict) and "unique_outputs" in v and "trials" in v:
        print(f"  {k:28s} unique={v['unique_outputs']}/{v['trials']} mean_accept_length={v.get('mean_accept_length')}")
    elif not k.startswith("_"):
        print(f"  {k:28s} {json.dumps(v)[:300]}")
PYEOF
      fi;;
  esac
done

status=0
echo "=== summary ($OUTDIR) ==="
for p in ${ONLY//,/ }; do
  echo "  $p: exit ${RC[$p]:-not run}"
  [ "${RC[$p]:-1}" = 0 ] || status=1
done
exit $status
