# Stage SGLang 0.5.17 and this checkout on the lent H200 (../shared/gpu/README.md), idempotently.
#
#   device tool: carry [".gpu-bundle"], command:
#     source scripts/gpu_stage.sh && bash scripts/run_gpu_checks.sh "$OUT/r" --only kernel --kernel-args "--only coupled"
#
# Source it (it exports PYTHONPATH and SGLANG_ENABLE_JIT_DEEPGEMM=0 for the rest of the command). It unpacks
# .gpu-bundle/part{1,2}.tar.xz (built here by ../shared/gpu/build_bundle.sh .gpu-bundle) into /tmp/site unless a
# warm machine already has it, installs this checkout editable with `python3 -m pip` (SGLang finds plugins by entry
# point, which needs the .dist-info; PYTHONPATH alone is not enough) and checks that the `detspec` entry point is
# visible. Returns 3, saying what is missing, where anything fails; nothing here downloads anything.
#
# Optional: torch_memory_saver (which the bundle lacks) for the Engine's release / resume test. Download its wheel
# here with `python3 -m pip download --no-deps torch_memory_saver -d .whl` (it ships cu12 and cu13 builds) and carry
# [".gpu-bundle", ".whl"]; a wheel found in .whl/ is installed offline, and the test skips, saying why, without it.
_detspec_stage() {
  if [ ! -d /tmp/site/sglang ]; then
    if [ ! -f .gpu-bundle/part1.tar.xz ] || [ ! -f .gpu-bundle/part2.tar.xz ]; then
      echo "gpu_stage.sh: .gpu-bundle/part1.tar.xz and part2.tar.xz are missing: build them with" \
        "../shared/gpu/build_bundle.sh .gpu-bundle and carry .gpu-bundle" >&2
      return 3
    fi
    mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu-bundle/part1.tar.xz && tar -C /tmp/site -xJf .gpu-bundle/part2.tar.xz ||
      { echo "gpu_stage.sh: unpacking the bundle into /tmp/site failed" >&2; return 3; }
  fi
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" SGLANG_ENABLE_JIT_DEEPGEMM=0
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/detspec-pip.log 2>&1 ||
    { tail -20 /tmp/detspec-pip.log >&2; echo "gpu_stage.sh: pip install -e . failed" >&2; return 3; }
  local tms_wheel
  tms_wheel=$(ls .whl/torch_memory_saver-*.whl 2>/dev/null | head -1)
  if [ -n "$tms_wheel" ]; then
    python3 -m pip install -q --no-deps --no-index "$tms_wheel" >/tmp/detspec-tms-pip.log 2>&1 ||
      { tail -20 /tmp/detspec-tms-pip.log >&2; echo "gpu_stage.sh: installing $tms_wheel failed" >&2; return 3; }
  fi
  python3 -c "from importlib.metadata import entry_points as e; import sys
sys.exit(0 if 'detspec' in [x.name for x in e(group='sglang.srt.plugins')] else 3)" ||
    { echo "gpu_stage.sh: the sglang.srt.plugins entry point 'detspec' is not visible to python3" >&2; return 3; }
  echo "gpu_stage.sh: SGLang $(python3 -c 'import sglang; print(sglang.__version__)') staged, sglang-detspec installed"
}
_detspec_stage
