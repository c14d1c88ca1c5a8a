"""SGLang's own plugin loader finds and runs the ``detspec`` entry point; the version gate.

The loader tests run in a fresh interpreter (what a spawned scheduler process is) with the real
``sglang.srt.plugins.load_plugins``; nothing of SGLang is mocked.
"""

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from sglang_detspec.integration import compat

# Written out, not imported: the registered names are part of the command-line interface.
ALL_NAMES = ["DETSPEC_EAGLE", "DETSPEC_EAGLE3", "DETSPEC_EAGLE_INVARIANT", "DETSPEC_EAGLE3_INVARIANT"]

_LOADER_SCRIPT = textwrap.dedent(
    r"""
    import json, logging, os, sys

    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append((record.name, record.levelname, record.getMessage()))

    logging.getLogger().addHandler(Collect())
    logging.getLogger().setLevel(logging.INFO)

    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def known(name):
        try:
            return SpeculativeAlgorithm.from_string(name)
        except ValueError:
            return None

    out = {}
    # 1) the SGLANG_PLUGINS filter excludes us: nothing registered, so registration comes from the entry point
    os.environ["SGLANG_PLUGINS"] = "some-other-plugin"
    plugins.load_plugins()
    out["filtered_known"] = known("DETSPEC_EAGLE") is not None

    # 2) the loader, as every SGLang process runs it
    os.environ["SGLANG_PLUGINS"] = "detspec"
    plugins._plugins_loaded = False
    plugins.load_plugins()
    first = {n: known(n) for n in ("DETSPEC_EAGLE", "DETSPEC_EAGLE3", "DETSPEC_EAGLE_INVARIANT", "DETSPEC_EAGLE3_INVARIANT")}
    out["first"] = {n: type(a).__name__ if a is not None else None for n, a in first.items()}

    from sglang_detspec.integration import compat
    from sglang_detspec.integration.setup import server_args
    from sglang_detspec.plugin import plugin_status

    target = compat.resolution_entry_target()
    out["hook_active"] = server_args.resolution_hook_active()
    out["status"] = plugin_status()

    # 3) loading again (a second load_plugins in one process) must not raise and must not register twice
    plugins._plugins_loaded = False
    plugins.load_plugins()
    second = {n: known(n) for n in ("DETSPEC_EAGLE", "DETSPEC_EAGLE3", "DETSPEC_EAGLE_INVARIANT", "DETSPEC_EAGLE3_INVARIANT")}
    out["same_objects"] = all(first[n] is second[n] for n in first)
    out["registry_entries"] = sorted(k for k in spec_registry._REGISTRY if k.startswith("DETSPEC"))
    out["hook_registrations"] = sum(
        1 for _, hook, _ in HookRegistry._hooks.get(target, []) if hook is server_args.around_resolution
    )
    out["failures"] = [r for r in records if r[1] in ("ERROR", "CRITICAL") or "Failed" in r[2]]
    out["executed"] = sum(1 for r in records if r[2] == "Executed general plugin: detspec")
    print("RESULT " + json.dumps(out))
    """
)


def _run(script, env_extra=None, timeout=300):
    env = dict(os.environ)
    env.pop("SGLANG_PLUGINS", None)
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env)
    return proc


def test_entry_point_is_declared():
    eps = [ep for ep in metadata.entry_points(group="sglang.srt.plugins") if ep.name == "detspec"]
    assert len(eps) == 1, "the project is not installed (pip install -e .) or the entry point moved"
    assert eps[0].value == "sglang_detspec.plugin:load_plugin"


def test_sglang_loader_registers_once_in_a_fresh_process():
    proc = _run(_LOADER_SCRIPT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["filtered_known"] is False
    assert out["first"] == {
        "DETSPEC_EAGLE": "DetspecEagleAlgo",
        "DETSPEC_EAGLE3": "DetspecEagle3Algo",
        "DETSPEC_EAGLE_INVARIANT": "DetspecEagleInvariantAlgo",
        "DETSPEC_EAGLE3_INVARIANT": "DetspecEagle3InvariantAlgo",
    }
    assert out["hook_active"] is True
    assert out["status"]["token_id_sampler_hook_active"] is True  # applied by SGLang's own loader, not by us
    assert out["status"]["batch_invariant_ops_hooks_active"] is True
    assert out["status"]["attention_index_cache_hooks_active"] is True
    assert out["status"]["request_validation_active"] is True
    assert out["status"]["algorithms"] == ALL_NAMES
    assert out["status"]["sglang_version"] == metadata.version("sglang")
    assert out["same_objects"] is True
    assert sorted(out["registry_entries"]) == sorted(ALL_NAMES)
    assert out["hook_registrations"] == 1
    assert out["executed"] == 2, "SGLang's loader should report running the plugin once per load_plugins call"
    assert out["failures"] == []


# --------------------------------------------------------------------------------------------------
# Version gate (compat.check_sglang_version; cheap, no SGLang import)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [("0.5.23", (0, 5, 23)), ("0.5.17", (0, 5, 17)), ("0.5.23.post1", (0, 5, 23)), ("0.5.24rc1", (0, 5, 24)),
     ("0.6", (0, 6, 0)), ("v0.5.20", (0, 5, 20))],
)
def test_parse_version(text, expected):
    assert compat.parse_version(text) == expected


@pytest.mark.parametrize("text", ["0.5.17", "0.5.20", "0.5.23", "0.5.23.post2"])
def test_supported_versions_pass(monkeypatch, text):
    monkeypatch.setattr(compat, "installed_sglang_version", lambda: text)
    monkeypatch.delenv(compat.SKIP_VERSION_CHECK_ENV, raising=False)
    assert compat.check_sglang_version(required=True) == compat.parse_version(text)


@pytest.mark.parametrize("text", ["0.5.16", "0.5.24", "0.5.24rc1", "0.6.0", "0.4.9"])
def test_unsupported_versions_are_refused_with_the_range(monkeypatch, text):
    monkeypatch.setattr(compat, "installed_sglang_version", lambda: text)
    monkeypatch.delenv(compat.SKIP_VERSION_CHECK_ENV, raising=False)
    with pytest.raises(compat.UnsupportedSGLangVersion) as info:
        compat.check_sglang_version(required=False)
    assert "0.5.17 to 0.5.23" in str(info.value) and text in str(info.value)
    assert isinstance(info.value, ImportError)


def test_skip_env_downgrades_refusal(monkeypatch, caplog):
    monkeypatch.setattr(compat, "installed_sglang_version", lambda: "0.5.30")
    monkeypatch.setenv(compat.SKIP_VERSION_CHECK_ENV, "1")
    assert compat.check_sglang_version(required=True) == (0, 5, 30)
    assert "0.5.17 to 0.5.23" in caplog.text


def test_missing_sglang(monkeypatch):
    monkeypatch.setattr(compat, "installed_sglang_version", lambda: None)
    assert compat.check_sglang_version(required=False) is None
    with pytest.raises(compat.UnsupportedSGLangVersion, match="0.5.17 to 0.5.23"):
        compat.check_sglang_version(required=True)


_FAKE_VERSION_SCRIPT = textwrap.dedent(
    r"""
    import importlib.metadata as md, sys
    real = md.version
    md.version = lambda name: "0.5.24" if name == "sglang" else real(name)
    import sglang_detspec.stream.keys, sglang_detspec.stream.reference   # must not need SGLang at all
    for mod in ("sglang_detspec.integration", "sglang_detspec.plugin"):
        try:
            __import__(mod)
        except ImportError as exc:
            print("REFUSED", mod, type(exc).__name__, str(exc).replace("\n", " "))
        else:
            print("IMPORTED", mod)
    print("SGLANG_IMPORTED", "sglang" in sys.modules)
    """
)


def test_import_refuses_unsupported_installed_version_without_importing_sglang():
    proc = _run(_FAKE_VERSION_SCRIPT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for mod in ("sglang_detspec.integration", "sglang_detspec.plugin"):
        refused = [line for line in lines if line.startswith(f"REFUSED {mod} ")]
        assert refused, proc.stdout
        assert "UnsupportedSGLangVersion" in refused[0] and "0.5.17 to 0.5.23" in refused[0] and "0.5.24" in refused[0]
    assert "SGLANG_IMPORTED False" in lines
