"""End to end: the plugin is installed the way SGLang finds it.

The determinism tests themselves (DETSPEC_EAGLE / DETSPEC_EAGLE3 under every traffic profile of
``sglang-detspec check``, with and without CUDA graphs and overlap scheduling, on the weighted tiny pair,
with failing controls) are in test_e2e_real_traffic.py.
"""

import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=30, suite="detspec-e2e")

pytestmark = h.module_marks()


def test_plugin_entry_point_is_installed():
    """SGLang finds plugins through the ``sglang.srt.plugins`` entry point; without the package's
    dist-info (``pip install -e .``) every DETSPEC server below would fail with an unknown algorithm."""
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="sglang.srt.plugins")}
    assert eps.get("detspec") == "sglang_detspec.plugin:load_plugin", (
        f"sglang-detspec is not installed as an SGLang plugin (entry points: {eps}); run `pip install -e .`"
    )


if __name__ == "__main__":
    h.run_module(__file__)
