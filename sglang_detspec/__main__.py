"""``python -m sglang_detspec`` is the ``sglang-detspec`` command."""

from sglang_detspec.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
