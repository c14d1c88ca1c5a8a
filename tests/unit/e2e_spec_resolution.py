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


#: Model paths that never exist: building specs reads only their names.
FAKE_MODELS = type("Models", (), {"target": "/c/weighted/t", "eagle_draft": "/d", "eagle3_draft": "/d3"})()


def session_specs(harness, monkeypatch):
    """``harness.server_specs`` of the weighted pair on :data:`FAKE_MODELS`, without the multi-layer and invariant
    servers (they need a draft built on disk)."""
    monkeypatch.setattr(harness, "multi_layer_specs", lambda *args: [])
    monkeypatch.setattr(harness, "invariant_specs", lambda *args: [])
    return harness.server_specs(FAKE_MODELS, pair="weighted")


def invariant_session_specs(harness, monkeypatch):
    """``harness.invariant_specs`` of the weighted pair on :data:`FAKE_MODELS`, by name, with the second draft and the
    multi-layer arguments stubbed (they need models on disk)."""
    import sglang_detspec.models.second_eagle_draft as second

    monkeypatch.setattr(harness, "multi_layer_args", lambda *args: [])
    monkeypatch.setattr(second, "ensure_second_eagle_draft", lambda root: "/d2")
    return {s.name: s for s in harness.invariant_specs(FAKE_MODELS, ["--model-path", "/t"], "weighted")}
