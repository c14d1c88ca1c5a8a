#!/usr/bin/env python3
"""Decode-step profile by op category and GEMM weight (issue 32, item 1): ``bench-serve --profile-steps`` with the
configurations that separate SGLang's deterministic kernels, the plugin's and the non-deterministic ones.

    python scripts/bench/profile_ops.py --out DIR [--pair midsize|llama8b] [--profile-steps 20] [any bench-serve option]

Defaults added unless given: ``--configs no_spec_fast,no_spec,no_spec_plugin_ops,eagle_rs,detspec_sglang_ops,detspec``,
``--concurrencies 1,8`` and ``--profile-steps 20``.  See sglang_detspec/bench/serving_bench/profile_runner.py.
"""

import sys

from sglang_detspec.bench.serving_bench import main

DEFAULTS = {
    "--configs": "no_spec_fast,no_spec,no_spec_plugin_ops,eagle_rs,detspec_sglang_ops,detspec",
    "--concurrencies": "1,8",
    "--profile-steps": "20",
}


def with_defaults(argv):
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    extra = [x for flag, value in DEFAULTS.items() if flag not in given for x in (flag, value)]
    return list(argv) + extra


if __name__ == "__main__":
    raise SystemExit(main(with_defaults(sys.argv[1:])))
