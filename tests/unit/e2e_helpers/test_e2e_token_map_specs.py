"""CPU tests of what tests/e2e/test_e2e_token_map.py relies on before it reaches a GPU: its servers' specs, resolved by
SGLang's own parser and resolution (with the plugin loaded) to what each is meant to run, and the DETSPEC refusal
raised there with exactly the text the GPU test looks for in the server logs. The upstream refusal (rejection
sampling with a token map) happens in the draft worker, which needs a GPU; here its text is checked against the
installed SGLang's source."""

import inspect
import re
from pathlib import Path

import pytest
import test_e2e_token_map as e2e

from e2e_spec_resolution import resolve_spec


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The module's specs over models and a token map built under a temporary root."""
    root = tmp_path_factory.mktemp("token-map-e2e")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DETSPEC_TINY_MODELS_ROOT", str(root))
        return root, e2e._specs()


def test_the_module_serves_two_and_refuses_two(built):
    _, specs = built
    assert set(e2e.SERVING) == {n for n, s in specs.items() if not s.expect_exit}
    assert set(e2e.REFUSAL_NEEDLES) == {n for n, s in specs.items() if s.expect_exit}
    for spec in specs.values():
        assert spec.args.count("--speculative-token-map") == 1
        assert "SGLANG_DETSPEC_REDUCED_VOCAB" not in spec.env  # retired: the token map is served without it


@pytest.mark.parametrize("name", e2e.SERVING)
def test_served_specs_resolve_to_detspec_eagle_with_the_token_map(built, name, monkeypatch):
    pytest.importorskip("sglang")
    from sglang_detspec.integration import compat
    from sglang_detspec.models.tiny_models import ensure_tiny_models
    from sglang_detspec.models.token_map import ensure_weighted_token_map

    root, specs = built
    sa = resolve_spec(specs[name], monkeypatch)
    read = lambda f: compat.read_field(sa, f, None)  # noqa: E731
    models = ensure_tiny_models(root, pair="weighted")
    assert read("speculative_algorithm") == "DETSPEC_EAGLE"
    assert read("enable_deterministic_inference") is True
    assert Path(read("model_path")) == models.target
    assert Path(read("speculative_draft_model_path")) == models.eagle_draft
    assert Path(read("speculative_token_map")) == ensure_weighted_token_map(root)
    assert (read("cuda_graph_backend_decode") == "disabled") is (name == "token_map_nograph")


@pytest.mark.parametrize("name", ["token_map_invariant"])
def test_refused_specs_raise_the_text_the_gpu_test_looks_for(built, name, monkeypatch):
    pytest.importorskip("sglang")
    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    from sglang_detspec.integration.setup.refusals import DetspecConfigError

    spec = built[1][name]
    with pytest.raises(DetspecConfigError) as e:
        resolve_spec(spec, monkeypatch)
    for needle in e2e.REFUSAL_NEEDLES[name]:
        assert needle in str(e.value), (needle, str(e.value))


def test_the_invariant_refusal_is_the_token_maps(built, monkeypatch):
    """Control: the invariant spec resolves once the token map is dropped, so its refusal is the map's."""
    pytest.importorskip("sglang")
    spec = built[1]["token_map_invariant"]
    at = spec.args.index("--speculative-token-map")
    args = spec.args[:at] + spec.args[at + 2:]
    sa = resolve_spec(type(spec)(spec.name, args), monkeypatch)
    assert sa.speculative_algorithm == "DETSPEC_EAGLE_INVARIANT"


def test_upstream_rejection_sampling_refusal_text_is_the_installed_sglangs(built, monkeypatch):
    pytest.importorskip("sglang")
    from sglang.srt.speculative import eagle_worker_v2

    spec = built[1]["token_map_builtin_eagle_rs"]
    sa = resolve_spec(spec, monkeypatch)  # upstream's argument resolution lets it through; its draft worker refuses
    assert sa.speculative_algorithm == "EAGLE" and sa.speculative_use_rejection_sampling is True
    source = re.sub(r'"\s*\n\s*f?"', "", inspect.getsource(eagle_worker_v2))  # join implicitly concatenated literals
    needle, sizes = e2e.REFUSAL_NEEDLES["token_map_builtin_eagle_rs"]
    assert needle in source
    assert "({draft_vocab_size}) != target vocab ({target_vocab_size})" in source and sizes == "(512) != target vocab (1024)"
