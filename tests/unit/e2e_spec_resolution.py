"""Resolving an E2E server's spec (tests/e2e: its args and env) on CPU, by SGLang's own parser and resolution with the
plugin loaded: what the tests under tests/unit/e2e_helpers compare to what each server is meant to run, so a typo in
a flag fails on CPU instead of costing a GPU run."""

import argparse


def resolve_spec(spec, monkeypatch):
    """The ``ServerArgs`` SGLang resolves from ``spec.args`` with ``spec.env`` set (through ``monkeypatch``); a DETSPEC
    refusal raises here as it would at start-up."""
    from sglang_detspec.plugin import load_plugin

    load_plugin()
    from sglang.srt.server_args import ServerArgs

    for key, value in spec.env.items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    sa = ServerArgs.from_cli_args(parser.parse_args(spec.args + ["--device", "cuda"]))  # resolution needs a device
    if hasattr(sa, "resolve_once"):  # 0.5.23; 0.5.17 resolved in __post_init__
        sa.resolve_once()
    return sa
