#!/usr/bin/env python3
"""Accept length of speculative servers over many prompts and seeds, paired by prompt (issue 32). Needs a CUDA GPU
and sglang; see ``sglang_detspec.bench.accept_compare`` for what it measures.

    python scripts/bench/compare_accept_length.py --out DIR [--pair midsize|llama8b] [--configs eagle_rs,detspec]
                                                  [--prompts 32] [--seeds-per-prompt 16] [--start sequential]
"""

import sys

from sglang_detspec.bench.accept_compare import main

if __name__ == "__main__":
    sys.exit(main())
