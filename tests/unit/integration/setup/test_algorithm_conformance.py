"""The registered spec classes answer every question SGLang asks an algorithm, like their EAGLE twin.

The list of questions is derived from the installed SGLang source (an AST scan for method calls on
algorithm objects), so the test follows SGLang when a release adds a call site.
"""

import ast
import inspect
import json
import os
import re
from types import SimpleNamespace

import pytest
import torch

from sglang_detspec.plugin import load_plugin

load_plugin()

import sglang  # noqa: E402
from sglang.srt.speculative import spec_registry  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang.srt.speculative.spec_registry import CustomSpecAlgo  # noqa: E402

from sglang_detspec.integration import compat  # noqa: E402
from sglang_detspec.integration.setup import algorithm  # noqa: E402
from sglang_detspec.integration.setup.algorithm import (  # noqa: E402
    ALGORITHM_CLASSES,
    DetspecSpecAlgo,
    ResolutionHookInactive,
    detspec_worker_factory,
)

NAMES = list(ALGORITHM_CLASSES)
# Where DETSPEC deliberately answers differently from the builtin twin (see algorithm.py's docstring).
DELIBERATE_DIFFERENCES = {"supports_mixed_chunk"}

_RECEIVER = re.compile(r"(spec_algo|speculative_algo|^algo$|^algorithm$|^spec_alg)")
_MENTIONS_ALGORITHM = re.compile(r"spec_alg|speculative_algo|\balgo\b|\balgorithm\b|from_string")


def _interface_names():
    names = set(compat.enum_interface_methods())
    names |= {n for n, v in vars(CustomSpecAlgo).items() if callable(v) and not n.startswith("_")}
    return names - {"from_string", "register"}


def _called_on_algorithms(root):
    """Method names SGLang calls on algorithm objects: ``<x>.spec_algorithm.m(...)``, ``algo.m(...)``,
    ``SpeculativeAlgorithm.from_string(...).m(...)``, restricted to the algorithm interface."""
    interface = _interface_names()
    found = {}
    for dirpath, _dirs, files in os.walk(root):
        for fname in files:
            if not fname.endswith(".py"):
                continue
            path = os.path.join(dirpath, fname)
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                if not _MENTIONS_ALGORITHM.search(text):  # cheap pre-filter; parsing all of srt takes ~20 s
                    continue
                tree = ast.parse(text)
            except (SyntaxError, UnicodeDecodeError):
                continue
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr not in interface:
                    continue
                recv = node.func.value
                if isinstance(recv, ast.Attribute):
                    ok = bool(_RECEIVER.search(recv.attr))
                elif isinstance(recv, ast.Name):
                    ok = bool(_RECEIVER.search(recv.id))
                elif isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute):
                    ok = recv.func.attr == "from_string"
                else:
                    ok = False
                if ok:
                    found.setdefault(node.func.attr, os.path.relpath(path, root))
    return found


@pytest.fixture(scope="module")
def called():
    return _called_on_algorithms(os.path.join(os.path.dirname(sglang.__file__), "srt"))


@pytest.fixture(params=NAMES)
def algo(request):
    return SpeculativeAlgorithm.from_string(request.param)


def test_passes_sglangs_conformance_check():
    for cls in ALGORITHM_CLASSES.values():
        spec_registry._assert_custom_spec_algo_conforms(cls)  # SGLang's own registration check


def test_scan_sees_the_scheduler_calls(called):
    # The scan works: it finds the calls this project knows the scheduler makes in both releases.
    for name in ("is_eagle", "is_eagle3", "create_worker", "carries_draft_hidden_states", "create_future_map",
                 "need_topk", "supports_grammar_overlap", "build_disagg_draft_input"):
        assert name in called, f"scan did not find a call of {name}: {json.dumps(called, indent=1)}"


def test_answers_every_method_sglang_calls(called, algo):
    missing = sorted(name for name in called if not callable(getattr(algo, name, None)))
    assert missing == [], {name: called[name] for name in missing}


def test_has_every_enum_method(algo):
    missing = sorted(set(compat.enum_interface_methods()) - set(dir(type(algo))) - {"from_string", "register"})
    assert missing == []


def test_answers_predicates_like_the_twin(algo):
    twin = SpeculativeAlgorithm[algorithm.DETSPEC_TWINS[algo.name]]
    compared = 0
    for name, fn in compat.enum_interface_methods().items():
        if not re.match(r"^(is_|supports_|has_|need_|carries_)", name):
            continue
        if len(inspect.signature(fn).parameters) != 1:
            continue
        ours, theirs = getattr(algo, name)(), getattr(twin, name)()
        if name in DELIBERATE_DIFFERENCES:
            assert ours is False
        else:
            assert ours == theirs, f"{algo.name}.{name}() = {ours}, {twin.name}.{name}() = {theirs}"
        compared += 1
    assert compared >= 15
    assert algo.is_eagle() is True and algo.is_eagle3() is algo.name.startswith("DETSPEC_EAGLE3")
    assert algo.supports_overlap is True
    assert algo.get_platform_worker_cls() is None
    assert algo.get_num_tokens_per_req_for_target_verify(4, False) == 4


def test_create_future_map_is_a_future_map_of_this_algorithm(algo):
    from sglang.srt.managers.overlap_utils import FutureMap

    pool = SimpleNamespace(req_to_token=torch.zeros(8, 16, dtype=torch.int32))  # the one attribute it reads
    fmap = algo.create_future_map(torch.device("cpu"), pool, needs_cpu_seq_lens=False)
    assert isinstance(fmap, FutureMap)
    assert fmap.spec_algo is algo


def test_build_disagg_draft_input_takes_the_eagle_branch(algo, monkeypatch):
    import sglang.srt.speculative.eagle_disaggregation as eagle_disagg

    seen = []
    monkeypatch.setattr(eagle_disagg, "build_eagle_disagg_draft_input", lambda *a: seen.append(a) or "eagle-input")
    n_args = len(inspect.signature(compat.enum_interface_methods()["build_disagg_draft_input"]).parameters) - 1
    args = tuple(object() for _ in range(n_args))  # 0.5.17: 4 arguments (with server_args), 0.5.23: 3
    assert algo.build_disagg_draft_input(*args) == "eagle-input"
    assert seen == [args]


def test_server_args_callbacks_refuse_when_reached(algo):
    with pytest.raises(ResolutionHookInactive):
        algo.handle_server_args(SimpleNamespace())
    with pytest.raises(ResolutionHookInactive):
        algo.validate_server_args(SimpleNamespace())


def _resolved(tmp_path, arch, algorithm_name, **extra):
    from sglang.srt.server_args import ServerArgs

    cfg = dict(architectures=[arch], model_type="llama", hidden_size=256, intermediate_size=512,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
               max_position_embeddings=8192, torch_dtype="bfloat16", hybrid_layer_pattern=[0, 0])
    d = tmp_path / arch
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    sa = ServerArgs(model_path=str(d), device="cuda", speculative_algorithm=algorithm_name,
                    speculative_draft_model_path=str(d), enable_deterministic_inference=True,
                    # chunked prefill and the radix cache off: DETSPEC refuses them with multi-layer EAGLE
                    # (server_args.py)
                    attention_backend="triton", chunked_prefill_size=-1, disable_radix_cache=True, **extra)
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
    return sa


@pytest.mark.parametrize(
    "arch, extra",
    [("LlamaForCausalLM", {}), ("LlamaForCausalLM", {"enable_multi_layer_eagle": True}), ("MiMoV2ForCausalLM", {})],
    ids=["single-layer", "flag", "model-override"],
)
def test_worker_choice_mirrors_upstream(tmp_path, arch, extra):
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2

    from sglang_detspec.integration.workers.spec_workers import DetspecEAGLEWorkerV2, DetspecMultiLayerEagleWorkerV2

    ours = _resolved(tmp_path, arch, "DETSPEC_EAGLE", **extra)
    theirs = _resolved(tmp_path, arch, "EAGLE", **extra)
    upstream_cls = SpeculativeAlgorithm.EAGLE.create_worker(theirs)
    our_cls = SpeculativeAlgorithm.from_string("DETSPEC_EAGLE").create_worker(ours)
    expected = {EAGLEWorkerV2: DetspecEAGLEWorkerV2, MultiLayerEagleWorkerV2: DetspecMultiLayerEagleWorkerV2}
    assert our_cls is expected[upstream_cls]
    assert our_cls is detspec_worker_factory(ours)


def test_register_twice_is_a_no_op():
    before = {n: SpeculativeAlgorithm.from_string(n) for n in NAMES}
    again = algorithm.register_algorithms()
    assert again == before and all(again[n] is before[n] for n in NAMES)
    assert sorted(k for k in spec_registry._REGISTRY if k.startswith("DETSPEC")) == sorted(NAMES)
    load_plugin()  # the full entry point too
    assert all(SpeculativeAlgorithm.from_string(n) is before[n] for n in NAMES)


def test_a_foreign_registration_of_our_name_is_an_error(monkeypatch):
    monkeypatch.setitem(spec_registry._REGISTRY, "DETSPEC_EAGLE", CustomSpecAlgo("DETSPEC_EAGLE", lambda sa: object))
    with pytest.raises(RuntimeError, match="already registered"):
        algorithm.register_algorithms()
    with pytest.raises(RuntimeError, match="self-check failed for DETSPEC_EAGLE"):
        algorithm.verify_registration()


def test_self_check_catches_a_wrong_factory(monkeypatch):
    monkeypatch.setitem(spec_registry._REGISTRY, "DETSPEC_EAGLE3",
                        algorithm.DetspecEagle3Algo("DETSPEC_EAGLE3", lambda sa: object, supports_overlap=True))
    with pytest.raises(RuntimeError, match="different worker factory"):
        algorithm.verify_registration()


def test_interface_fill_delegates_to_the_enum_with_this_algorithm(monkeypatch):
    """A method a future release adds to the enum is answered through the enum's body with self = ours."""

    def supports_something(self):
        return self.is_eagle() and not self.is_eagle3()

    def is_plain_eagle_member(self):
        return self is SpeculativeAlgorithm.EAGLE

    fake = dict(compat.enum_interface_methods(), supports_something=supports_something,
                is_plain_eagle_member=is_plain_eagle_member)
    monkeypatch.setattr(compat, "enum_interface_methods", lambda: fake)

    class Probe(DetspecSpecAlgo):
        TWIN = "EAGLE"

    filled = algorithm._fill_interface(Probe)
    assert set(filled) >= {"supports_something", "is_plain_eagle_member"}
    probe = Probe("PROBE", detspec_worker_factory, supports_overlap=True)
    assert probe.supports_something() is True
    assert probe.is_plain_eagle_member() is False
    assert algorithm._fill_interface(Probe) == []


def test_load_plugin_raises_and_logs_when_registration_fails(monkeypatch, caplog):
    """SGLang's loader only logs a plugin's exception, so load_plugin logs an explicit error itself."""
    monkeypatch.setitem(spec_registry._REGISTRY, "DETSPEC_EAGLE", CustomSpecAlgo("DETSPEC_EAGLE", lambda sa: object))
    with pytest.raises(RuntimeError, match="already registered"):
        load_plugin()
    assert "registration FAILED" in caplog.text and "DETSPEC_EAGLE" in caplog.text


def test_load_plugin_reports_status():
    status = load_plugin()
    assert status["algorithms"] == NAMES
    assert status["resolution_hook_active"] is True
    assert status["scheduler_check_active"] is True
    assert status["retraction_replay_active"] is True
    assert status["resolution_target"] == compat.resolution_entry_target()
    assert compat.parse_version(status["sglang_version"]) == compat.parse_version(sglang.__version__)
