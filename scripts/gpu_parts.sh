#!/usr/bin/env bash
# The lent GPU's device call, in parts that each stop within their own time limit and leave their results behind.
#
#   device tool: carry [".gpu-bundle"], command: bash scripts/gpu_parts.sh LIMIT PART[,PART...]
#
# LIMIT: seconds for the whole command, bundle staging included (keep it under the call's timeout_s). Each part runs
# in its own process group under min(what is left, its cap) and is packed into $OUT/PART.tgz when it ends, so a call
# stopped at its limit still returns the parts that finished (the device returns at most 8 files). $OUT/card.txt
# names the card, the commit and each part's exit code and time. Parts:
#   xcard      cross-card record of the default kernels, compared with the other card's file in docs/cross_card
#   gemm_inv   tests/gpu/test_batch_invariant_gemm.py: rows bit-identical for every M, every shape of both pairs
#   gemm_ab    bench_gemm at M = 64 - 512 (both pairs), then again with split-K folded above 64 rows (the old bound)
#   tune       bench_gemm --tune of the 8B-shaped pair at M = 64 - 512
#   e2e_de     tests/e2e/test_e2e_split_kv_draft_extend.py (the opt-in draft-extend kernel)
#   families   tests/e2e/test_e2e_families.py
#   serve18    bench-serve, mid-size pair, eagle_rs / detspec / detspec_split_kv_draft_extend at c = 1, 8
#   serve_hi   bench-serve, mid-size pair, eagle_rs / detspec at c = 32, 128
PARTS_KNOWN="xcard gemm_inv gemm_ab tune e2e_de families serve18 serve_hi"
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
[ $# -eq 2 ] && [[ "$1" =~ ^[0-9]+$ ]] || usage
LIMIT=$1; PARTS=$2
for p in ${PARTS//,/ }; do
  [[ " $PARTS_KNOWN " == *" $p "* ]] || { echo "gpu_parts.sh: unknown part '$p' ($PARTS_KNOWN)" >&2; exit 2; }
done
[ -n "${OUT:-}" ] && [ -d "$OUT" ] ||
  { echo "gpu_parts.sh: \$OUT must be a folder (the device tool sets it)" >&2; exit 2; }
T0=$SECONDS
left() { echo $((LIMIT - (SECONDS - T0))); }
source scripts/gpu_stage.sh > "$OUT/card.txt" 2>&1 || { cat "$OUT/card.txt"; exit 3; }
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$CARD $(git rev-parse --short HEAD 2>/dev/null) staged after $((SECONDS - T0))s" | tee -a "$OUT/card.txt"
export PYTHONUNBUFFERED=1
# run NAME MIN_SECONDS CAP CMD: CMD (which may use $P, the part's folder) in its own process group under
# min(time left, CAP), killed as a group
run() {
  local name=$1 need=$2 cap=$3; shift 3
  local t=$(( $(left) - 15 )); [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt "$need" ]; then echo "$name: skipped, ${t}s left (< $need)" | tee -a "$OUT/card.txt"; return; fi
  local s=$SECONDS P="$OUT/$name"; mkdir -p "$P"
  P="$P" setsid bash -c "$*" > "$P/log" 2>&1 & local pid=$!
  ( sleep "$t"; kill -TERM -- -$pid 2>/dev/null; sleep 5; kill -KILL -- -$pid 2>/dev/null ) & local w=$!
  wait $pid; local rc=$?
  kill $w 2>/dev/null
  echo "$name: rc=$rc in $((SECONDS - s))s (limit ${t}s)" | tee -a "$OUT/card.txt"
  tail -n 25 "$P/log"
  tar czf "$OUT/$name.tgz" -C "$OUT" "$name" && rm -rf "$P"
}
SERVE="python3 -m sglang_detspec bench-serve --pair midsize --models-dir /tmp/models-midsize --output-len 512"
SERVE="$SERVE --repetitions 3 --start parallel --order interleaved --out \$P"
GEMM="python3 scripts/bench/bench_gemm.py --ms 64 128 256 512"
E2E="bash scripts/run_gpu_checks.sh \$P --only e2e --e2e-tests"
case "$CARD" in  # the recording of the other card to compare with
  *H200*) OTHER_CARD=docs/cross_card/h100-split-kv-31b0632.json.gz ;;
  *) OTHER_CARD=docs/cross_card/h200-split-kv-89b19e4.json.gz ;;
esac
for p in ${PARTS//,/ }; do
  case $p in
    xcard) run xcard 150 330 "python3 scripts/cross_card.py record --out \$P/here.json --compare-with $OTHER_CARD" ;;
    gemm_ab) run gemm_ab 50 150 "$GEMM --pairs midsize llama8b --out \$P/new &&
                                 $GEMM --pairs midsize llama8b --split-programs-max-m 64 --out \$P/fold64" ;;
    gemm_inv) run gemm_inv 100 150 \
      'DETSPEC_GPU_OUT=$P python3 -m pytest -v -s -p no:cacheprovider tests/gpu/test_batch_invariant_gemm.py' ;;
    e2e_de) run e2e_de 300 600 "$E2E tests/e2e/test_e2e_split_kv_draft_extend.py" ;;
    families) run families 300 600 "$E2E tests/e2e/test_e2e_families.py" ;;
    serve_hi) run serve_hi 250 600 "$SERVE --configs eagle_rs,detspec --concurrencies 32,128 --min-seconds 12" ;;
    serve18) run serve18 250 600 \
      "$SERVE --configs eagle_rs,detspec,detspec_split_kv_draft_extend --concurrencies 1,8 --min-seconds 20" ;;
    tune) run tune 60 170 "$GEMM --tune --pairs llama8b --out \$P" ;;
  esac
done
echo "total $((SECONDS - T0))s"
