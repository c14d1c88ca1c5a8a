#!/usr/bin/env python3
"""Reproducible across cards (issue 34, item 6): record the seeded tiny-pair answers on one GPU, compare on another.

    python scripts/cross_card.py record --out h100.json                      # on the H100
    python scripts/cross_card.py record --out h200.json --compare-with h100.json   # on the H200
    python scripts/cross_card.py compare h100.json h200.json                 # anywhere, no GPU
    python scripts/cross_card.py logprob-gap gap.json    # logprobs against NONE's (recorded with NONE), no GPU

The logic lives in ``sglang_detspec.checker.cross_card`` (its docstring: the request set, the file, the exit codes).
"""

import sys

from sglang_detspec.checker.cross_card import main

if __name__ == "__main__":
    sys.exit(main())
