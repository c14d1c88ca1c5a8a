#!/usr/bin/env python3
"""Build (once) the tiny offline target/EAGLE/EAGLE3 model dirs and print their paths.

Usage: python scripts/make_tiny_models.py [--root DIR] [--json]
Without --root they go to $XDG_CACHE_HOME/sglang-detspec (~/.cache/sglang-detspec). Serve them with
`--load-format dummy` (they hold configs and a tokenizer, no weights).
"""
import argparse
import json
import os
import sys
from pathlib import Path

from sglang_detspec.models.tiny_models import ensure_tiny_models


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=None, help="cache root (default: user cache dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of KEY=PATH lines")
    args = ap.parse_args(argv)
    m = ensure_tiny_models(args.root)
    if args.json:
        print(json.dumps({k: os.fspath(v) for k, v in m._asdict().items()}))
    else:
        for k, v in m._asdict().items():
            print(f"{k}={v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
