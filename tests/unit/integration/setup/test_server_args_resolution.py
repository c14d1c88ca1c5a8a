"""DETSPEC server arguments go through SGLang's own resolution (0.5.17: ``ServerArgs.__post_init__``,
0.5.23: ``resolve_once`` -> ``run_resolution_pipeline``), with the plugin's hook applied by ``load_plugin``.

The model "checkpoints" are config.json files only: resolution reads the HF config, never weights. The device
is given as ``cuda`` (this is how resolution runs without a GPU: nothing in it touches the device; with the
device left unset SGLang itself refuses to resolve on a machine without an accelerator).
"""

import dataclasses
import json

import pytest

from sglang_detspec.plugin import load_plugin

load_plugin()

from sglang.srt.server_args import ServerArgs  # noqa: E402

from sglang_detspec.integration import compat  # noqa: E402
from sglang_detspec.integration.setup import server_args as detspec_args  # noqa: E402
from sglang_detspec.integration.setup.algorithm import ResolutionHookInactive  # noqa: E402
from sglang_detspec.integration.setup.refusals import DetspecConfigError  # noqa: E402

NAMES = ["DETSPEC_EAGLE", "DETSPEC_EAGLE3"]
TWIN = {"DETSPEC_EAGLE": "EAGLE", "DETSPEC_EAGLE3": "EAGLE3"}
VOCAB = 512

_LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 1,
}


def _write(root, name, **overrides):
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**_LLAMA, **overrides}))
    return str(d)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("detspec-configs")
    return {
        "target": _write(root, "target", architectures=["LlamaForCausalLM"]),
        "eagle": _write(root, "eagle", architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1),
        "eagle3": _write(root, "eagle3", architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
                         draft_vocab_size=VOCAB),
        "eagle3_small_vocab": _write(root, "eagle3s", architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
                                     draft_vocab_size=VOCAB // 16),
        # An architecture whose SGLang model override switches multi-layer EAGLE on for the name "EAGLE".
        "mimo": _write(root, "mimo", architectures=["MiMoV2ForCausalLM"], hybrid_layer_pattern=[0, 0]),
        "gemma4_assistant": _write(root, "gemma4", architectures=["Gemma4AssistantForCausalLM"], num_hidden_layers=1),
    }


def resolve(**kwargs):
    sa = ServerArgs(**kwargs)
    resolve_once = getattr(sa, "resolve_once", None)  # 0.5.23; 0.5.17 resolved in __post_init__
    if resolve_once is not None:
        resolve_once()
    return sa


def field_names(sa):
    if dataclasses.is_dataclass(sa):
        return [f.name for f in dataclasses.fields(sa)]
    from sglang.srt.arg_groups.arg_utils import record_fields

    return [f.name for f in record_fields(type(sa))]


def resolved(sa, *names):
    return {n: compat.read_field(sa, n) for n in names}


def base_args(models, name, **extra):
    draft = models["eagle3"] if TWIN.get(name, name) == "EAGLE3" else models["eagle"]
    kw = dict(model_path=models["target"], device="cuda", speculative_algorithm=name,
              speculative_draft_model_path=draft, enable_deterministic_inference=True, random_seed=1234)
    kw.update(extra)
    return kw


def test_hook_is_active():
    assert detspec_args.resolution_hook_active()


@pytest.mark.parametrize("name", NAMES)
def test_resolves_exactly_like_the_twin_plus_rejection_sampling(models, name):
    """Every resolved field equals what SGLang resolves for the builtin twin, except the name and RS."""
    shape = dict(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    ours = resolve(**base_args(models, name, **shape))
    twin = resolve(**base_args(models, TWIN[name], **shape))
    a = {n: compat.read_field(ours, n) for n in field_names(ours)}
    b = {n: compat.read_field(twin, n) for n in field_names(twin)}
    diff = {n: (a[n], b[n]) for n in a if a[n] != b[n]}
    assert diff == {
        "speculative_algorithm": (name, TWIN[name]),
        "speculative_use_rejection_sampling": (True, False),
    }


@pytest.mark.parametrize("name", NAMES)
def test_defaults_rejection_sampling_and_eagle_family_settings(models, name):
    sa = resolve(**base_args(models, name))
    got = resolved(sa, "speculative_algorithm", "speculative_use_rejection_sampling", "speculative_eagle_topk",
                   "speculative_num_steps", "speculative_num_draft_tokens", "enable_deterministic_inference",
                   "sampling_backend", "max_running_requests", "enable_mixed_chunk", "speculative_draft_model_revision")
    assert got == {
        "speculative_algorithm": name,
        "speculative_use_rejection_sampling": True,
        "speculative_eagle_topk": 1,
        "speculative_num_steps": 3,
        "speculative_num_draft_tokens": 4,
        "enable_deterministic_inference": True,
        "sampling_backend": "pytorch",          # SGLang's deterministic mode
        "max_running_requests": 48,             # SGLang's EAGLE-family default
        "enable_mixed_chunk": False,
        "speculative_draft_model_revision": "main",
    }


@pytest.mark.parametrize(
    "given, expected",
    [
        (dict(speculative_num_steps=5), (5, 6)),
        (dict(speculative_num_draft_tokens=6), (5, 6)),
        (dict(speculative_num_steps=1), (1, 2)),
        (dict(speculative_num_steps=2, speculative_num_draft_tokens=3), (2, 3)),
        (dict(speculative_num_steps=4, speculative_eagle_topk=1), (4, 5)),
    ],
)
def test_chain_length_defaults(models, given, expected):
    sa = resolve(**base_args(models, "DETSPEC_EAGLE", **given))
    assert (compat.read_field(sa, "speculative_num_steps"), compat.read_field(sa, "speculative_num_draft_tokens")) == expected
    assert compat.read_field(sa, "speculative_eagle_topk") == 1


def test_name_is_case_insensitive(models):
    sa = resolve(**base_args(models, "detspec_eagle3"))
    assert compat.read_field(sa, "speculative_algorithm") == "DETSPEC_EAGLE3"
    assert compat.read_field(sa, "speculative_use_rejection_sampling") is True


def test_rl_on_policy_target_implies_deterministic(models):
    kw = base_args(models, "DETSPEC_EAGLE", enable_deterministic_inference=False)
    try:
        sa = resolve(rl_on_policy_target="fsdp", **kw)
    except ValueError as exc:  # "fsdp" is not a valid target in this release
        pytest.skip(f"rl_on_policy_target 'fsdp' not accepted here: {exc}")
    assert compat.read_field(sa, "enable_deterministic_inference") is True
    assert compat.read_field(sa, "speculative_algorithm") == "DETSPEC_EAGLE"


def test_model_override_for_the_eagle_name_applies(models):
    """SGLang switches MiMo-V2 to multi-layer EAGLE when the name is "EAGLE"; DETSPEC_EAGLE gets the same
    (with chunked prefill and the radix cache off, which multi-layer DETSPEC requires)."""
    kw = base_args(models, "DETSPEC_EAGLE", model_path=models["mimo"], attention_backend="triton",
                   chunked_prefill_size=-1, disable_radix_cache=True)
    assert compat.read_field(resolve(**kw), "enable_multi_layer_eagle") is True
    kw["speculative_algorithm"] = "EAGLE"
    assert compat.read_field(resolve(**kw), "enable_multi_layer_eagle") is True
    kw["model_path"] = models["target"]
    kw["speculative_algorithm"] = "DETSPEC_EAGLE"
    assert compat.read_field(resolve(**kw), "enable_multi_layer_eagle") is False


def test_builtin_algorithms_are_untouched(models):
    kw = base_args(models, "EAGLE", enable_deterministic_inference=False, speculative_num_steps=3,
                   speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    assert resolved(resolve(**kw), "speculative_algorithm", "speculative_use_rejection_sampling") == {
        "speculative_algorithm": "EAGLE", "speculative_use_rejection_sampling": False}
    kw["speculative_use_rejection_sampling"] = True
    assert resolved(resolve(**kw), "speculative_algorithm", "speculative_use_rejection_sampling") == {
        "speculative_algorithm": "EAGLE", "speculative_use_rejection_sampling": True}


def test_dummy_model_is_not_resolved_by_sglang_nor_by_us():
    sa = resolve(model_path="dummy", speculative_algorithm="DETSPEC_EAGLE")
    assert compat.read_field(sa, "speculative_algorithm") == "DETSPEC_EAGLE"
    assert compat.read_field(sa, "speculative_use_rejection_sampling") is False


# --------------------------------------------------------------------------------------------------
# Refusals: one per flag; each names the flag and the algorithm
# --------------------------------------------------------------------------------------------------

REFUSALS = [
    # id, name, extra kwargs, text the message must contain, field that must exist in this release
    ("no-deterministic", "DETSPEC_EAGLE", dict(enable_deterministic_inference=False),
     "requires --enable-deterministic-inference", None),
    ("topk", "DETSPEC_EAGLE", dict(speculative_eagle_topk=2, speculative_num_steps=3, speculative_num_draft_tokens=4),
     "--speculative-eagle-topk 2", None),
    ("device-cpu", "DETSPEC_EAGLE", dict(device="cpu"), "--device cpu", None),
    ("adaptive", "DETSPEC_EAGLE", dict(speculative_adaptive=True), "--speculative-adaptive", None),
    ("mixed-chunk", "DETSPEC_EAGLE", dict(enable_mixed_chunk=True), "--enable-mixed-chunk", None),
    ("threshold-single", "DETSPEC_EAGLE", dict(speculative_accept_threshold_single=0.5),
     "--speculative-accept-threshold-single 0.5", None),
    ("threshold-acc", "DETSPEC_EAGLE3", dict(speculative_accept_threshold_acc=0.9),
     "--speculative-accept-threshold-acc 0.9", None),
    # the invariant mode's race over a token map has never run on a GPU (DETSPEC_EAGLE serves one: below)
    ("token-map-invariant", "DETSPEC_EAGLE_INVARIANT", dict(speculative_token_map="/nonexistent/hot_tokens.pt"),
     "--speculative-token-map /nonexistent/hot_tokens.pt with an _INVARIANT algorithm", None),
    # upstream's EAGLE3 worker ignores a token map (it serves the draft's own d2t map), under either EAGLE3 algorithm
    ("token-map-eagle3", "DETSPEC_EAGLE3", dict(speculative_token_map="/nonexistent/hot_tokens.pt"),
     "--speculative-token-map /nonexistent/hot_tokens.pt with an EAGLE3 algorithm", None),
    ("token-map-eagle3-invariant", "DETSPEC_EAGLE3_INVARIANT", dict(speculative_token_map="/nonexistent/hot_tokens.pt"),
     "--speculative-token-map /nonexistent/hot_tokens.pt with an EAGLE3 algorithm", None),
    ("block-verification", "DETSPEC_EAGLE", dict(speculative_use_block_verification=True),
     "--speculative-use-block-verification", "speculative_use_block_verification"),
    ("watermark", "DETSPEC_EAGLE", dict(enable_watermark=True), "--enable-watermark", "enable_watermark"),
    ("aux-hidden-states", "DETSPEC_EAGLE3", dict(enable_return_aux_hidden_states=True),
     "--enable-return-aux-hidden-states", "enable_return_aux_hidden_states"),
    ("input-scattered-eagle3", "DETSPEC_EAGLE3", dict(enable_attn_tp_input_scattered=True),
     "--enable-attn-tp-input-scattered", None),
    ("no-draft", "DETSPEC_EAGLE", dict(speculative_draft_model_path=None), "--speculative-draft-model-path", None),
    # A release would discard the draft's weights, and nothing re-pushes them (refusals.py says why).
    ("memory-saver-without-draft-backup", "DETSPEC_EAGLE", dict(enable_memory_saver=True),
     "--enable-memory-saver without --enable-draft-weights-cpu-backup", None),
    # SGLang would reset these to steps + 1 (a log line, the launch goes on); an explicit value is refused instead.
    ("draft-tokens-off-the-chain", "DETSPEC_EAGLE", dict(speculative_num_steps=2, speculative_num_draft_tokens=7),
     "--speculative-num-draft-tokens 7 and --speculative-num-steps 2", None),
    ("draft-tokens-below-steps", "DETSPEC_EAGLE3", dict(speculative_num_steps=3, speculative_num_draft_tokens=2),
     "--speculative-num-draft-tokens 2 and --speculative-num-steps 3", None),
    ("one-draft-token", "DETSPEC_EAGLE", dict(speculative_num_draft_tokens=1), "--speculative-num-draft-tokens 1:",
     None),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refusal(models, case):
    _id, name, extra, text, needs_field = case
    if needs_field is not None and not compat.has_field(ServerArgs(model_path="dummy"), needs_field):
        pytest.skip(f"this SGLang release has no {needs_field} field")
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, name, **extra))
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert text in msg and name in msg, msg


@pytest.mark.parametrize("backup", ["enable_draft_weights_cpu_backup", "enable_weights_cpu_backup"])
def test_memory_saver_is_accepted_with_a_cpu_backup_of_the_draft_weights(models, backup):
    sa = resolve(**base_args(models, "DETSPEC_EAGLE", enable_memory_saver=True, **{backup: True}))
    assert resolved(sa, "speculative_algorithm", "enable_memory_saver", backup) == {
        "speculative_algorithm": "DETSPEC_EAGLE", "enable_memory_saver": True, backup: True}


@pytest.mark.parametrize("name", ["DETSPEC_EAGLE3", "DETSPEC_EAGLE3_INVARIANT"])
def test_a_reduced_eagle3_draft_is_served_with_an_info_line(models, monkeypatch, caplog, name):
    """An EAGLE3 draft's hot-token map is served in both modes (H100: one output per seed; lossless, and the invariant
    mode equal to the non-speculative reference), with no environment variable."""
    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    with caplog.at_level("INFO"):
        sa = resolve(**base_args(models, name, speculative_draft_model_path=models["eagle3_small_vocab"]))
    assert resolved(sa, "speculative_algorithm")["speculative_algorithm"] == name
    assert f"{name}: serving a reduced-vocabulary draft ({VOCAB // 16} of {VOCAB} target tokens)" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "vocab" in r.getMessage().lower()]


@pytest.mark.parametrize("name", ["DETSPEC_EAGLE", "DETSPEC_EAGLE_INVARIANT"])
def test_an_eagle3_style_draft_vocab_is_refused_under_the_eagle_twin(models, name):
    """Under the EAGLE twin only a --speculative-token-map maps draft columns to target ids; a draft config's own
    draft_vocab_size would have its indices read as target ids."""
    with pytest.raises(DetspecConfigError, match=f"draft vocabulary of {VOCAB // 16} tokens") as info:
        resolve(**base_args(models, name, speculative_draft_model_path=models["eagle3_small_vocab"]))
    msg = str(info.value)
    assert name in msg and "DETSPEC_EAGLE3" in msg and "SGLANG_DETSPEC_REDUCED_VOCAB" not in msg


@pytest.mark.parametrize("value", ["1", "0", ""])
def test_the_retired_reduced_vocab_variable_only_warns(models, monkeypatch, caplog, value):
    monkeypatch.setenv("SGLANG_DETSPEC_REDUCED_VOCAB", value)
    with caplog.at_level("WARNING"):
        sa = resolve(**base_args(models, "DETSPEC_EAGLE3", speculative_draft_model_path=models["eagle3_small_vocab"]))
    assert resolved(sa, "speculative_algorithm")["speculative_algorithm"] == "DETSPEC_EAGLE3"
    warnings = [r.getMessage() for r in caplog.records if "SGLANG_DETSPEC_REDUCED_VOCAB" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "no longer needed and has no effect" in warnings[0]
    assert "reduced-vocabulary drafts are served without it" in warnings[0]


def test_no_retired_variable_warning_when_unset(models, monkeypatch, caplog):
    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    with caplog.at_level("WARNING"):
        resolve(**base_args(models, "DETSPEC_EAGLE3"))
    assert "SGLANG_DETSPEC_REDUCED_VOCAB" not in caplog.text


def test_refuses_draft_that_sglang_promotes_to_another_algorithm(models):
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, "DETSPEC_EAGLE", speculative_draft_model_path=models["gemma4_assistant"]))
    assert "FROZEN_KV_MTP" in str(info.value) and "--speculative-algorithm EAGLE" in str(info.value)


def test_refuses_rocm(models, monkeypatch):
    monkeypatch.setattr(detspec_args, "torch_is_rocm", lambda: True)
    with pytest.raises(DetspecConfigError, match="ROCm"):
        resolve(**base_args(models, "DETSPEC_EAGLE"))


def test_refuses_out_of_tree_platform(models, monkeypatch):
    monkeypatch.setattr(detspec_args, "platform_is_out_of_tree", lambda: True)
    with pytest.raises(DetspecConfigError, match="out-of-tree"):
        resolve(**base_args(models, "DETSPEC_EAGLE"))


def test_check_draft_vocab_for_worker_init(monkeypatch, caplog):
    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    detspec_args.check_draft_vocab("DETSPEC_EAGLE3", VOCAB, VOCAB)
    detspec_args.check_draft_vocab("DETSPEC_EAGLE3", None, VOCAB)
    with caplog.at_level("INFO"):
        detspec_args.check_draft_vocab("DETSPEC_EAGLE3", 32000, 128256)  # EAGLE3's d2t map
        detspec_args.check_draft_vocab("DETSPEC_EAGLE3_INVARIANT", 32000, 128256)
        detspec_args.check_draft_vocab("DETSPEC_EAGLE", 32000, 128256, token_map=True)
    for name in ("DETSPEC_EAGLE3", "DETSPEC_EAGLE3_INVARIANT", "DETSPEC_EAGLE"):
        assert f"{name}: serving a reduced-vocabulary draft (32000 of 128256 target tokens)" in caplog.text
    assert "through the --speculative-token-map" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    # A full-size hot map (a permutation) is a reduced draft too: its draft indices are not target ids.
    detspec_args.check_draft_vocab("DETSPEC_EAGLE3", VOCAB, VOCAB, reduced=True)
    detspec_args.check_draft_vocab("DETSPEC_EAGLE", VOCAB, VOCAB, reduced=True, token_map=True)
    for name in ("DETSPEC_EAGLE3", "DETSPEC_EAGLE3_INVARIANT", "DETSPEC_EAGLE"):
        with pytest.raises(DetspecConfigError, match="multi-layer"):
            detspec_args.check_draft_vocab(name, 32000, 128256, multi_layer=True, token_map=name == "DETSPEC_EAGLE")
    # The invariant mode races a token map never (it has not run on a GPU), nor a non-EAGLE3 reduced draft.
    for token_map in (True, False):
        with pytest.raises(DetspecConfigError, match="DETSPEC_EAGLE3_INVARIANT for an EAGLE3 draft") as info:
            detspec_args.check_draft_vocab("DETSPEC_EAGLE_INVARIANT", 32000, 128256, token_map=token_map)
        assert "SGLANG_DETSPEC_REDUCED_VOCAB" not in str(info.value)
    # Under DETSPEC_EAGLE a reduced draft that is not a token map (a config's own draft_vocab_size) is refused.
    for reduced in (None, True):
        with pytest.raises(DetspecConfigError, match="only through --speculative-token-map") as info:
            detspec_args.check_draft_vocab("DETSPEC_EAGLE", 32000 if reduced is None else VOCAB,
                                           128256 if reduced is None else VOCAB, reduced=reduced)
        assert "SGLANG_DETSPEC_REDUCED_VOCAB" not in str(info.value)


def test_token_map_is_served_by_detspec_eagle_single_layer_only(models, monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    token_map = str(tmp_path / "hot_tokens.pt")  # the file is read by the draft worker, not at resolution
    with caplog.at_level("WARNING"):
        sa = resolve(**base_args(models, "DETSPEC_EAGLE", speculative_token_map=token_map))
    assert resolved(sa, "speculative_algorithm", "speculative_token_map") == {
        "speculative_algorithm": "DETSPEC_EAGLE", "speculative_token_map": token_map}
    assert "vocab" not in caplog.text.lower()
    with pytest.raises(DetspecConfigError, match="--speculative-token-map") as info:
        resolve(**base_args(models, "DETSPEC_EAGLE_INVARIANT", speculative_token_map=token_map))
    msg = str(info.value)
    assert "with an _INVARIANT algorithm" in msg and "never run on a GPU" in msg
    assert "DETSPEC_EAGLE with the map" in msg and "or DETSPEC_EAGLE_INVARIANT without the map" in msg
    # SGLang's EAGLE3 worker ignores a token map (EAGLEWorkerV2.init_token_map, 0.5.17 - 0.5.23): refused under both
    # EAGLE3 algorithms, the invariant one included, pointing at the draft's own hot map.
    for name in ("DETSPEC_EAGLE3", "DETSPEC_EAGLE3_INVARIANT"):
        with pytest.raises(DetspecConfigError) as info:
            resolve(**base_args(models, name, speculative_token_map=token_map))
        msg = str(info.value)
        assert msg.startswith(f"--speculative-algorithm {name} cannot be used with --speculative-token-map {token_map} "
                              "with an EAGLE3 algorithm: "), msg
        assert "ignores the token map" in msg and "Drop --speculative-token-map" in msg and "d2t" in msg
    with pytest.raises(DetspecConfigError, match="with multi-layer EAGLE"):
        resolve(**base_args(models, "DETSPEC_EAGLE", speculative_token_map=token_map,
                            enable_multi_layer_eagle=True))


def test_without_the_hook_sglang_refuses_loudly(models, monkeypatch):
    """If the resolution hook is bypassed, SGLang's custom-algorithm handler reaches our guard."""
    monkeypatch.setattr(detspec_args, "requested_detspec_algorithm", lambda sa: None)
    with pytest.raises(ResolutionHookInactive, match="resolution hook is not active"):
        resolve(**base_args(models, "DETSPEC_EAGLE"))


@pytest.mark.parametrize("name", NAMES)
def test_what_a_scheduler_sees(models, name):
    """The record crosses to the scheduler by pickling (spawn) and is published into the config bags the
    workers read (get_spec / get_exec); the published name resolves to the registered DETSPEC algorithm."""
    import pickle

    from sglang.srt.runtime_context import get_exec, get_spec, publish, reset_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_detspec.integration.setup.algorithm import ALGORITHM_CLASSES

    child = pickle.loads(pickle.dumps(resolve(**base_args(models, name))))
    try:
        publish(child, role="tokenizer")
        spec = get_spec()
        assert (spec.speculative_algorithm, spec.speculative_use_rejection_sampling, spec.speculative_eagle_topk,
                spec.speculative_num_steps, spec.speculative_num_draft_tokens) == (name, True, 1, 3, 4)
        assert get_exec().deterministic.enable_deterministic_inference is True
        assert isinstance(SpeculativeAlgorithm.from_string(spec.speculative_algorithm), ALGORITHM_CLASSES[name])
    finally:
        reset_context()


# --------------------------------------------------------------------------------------------------
# --chunked-prefill-size against the deterministic prefill alignment (the scheduler's own value is the oracle)
# --------------------------------------------------------------------------------------------------


def scheduler_alignment(sa):
    """``truncation_align_size`` the installed scheduler derives from the resolved, published record."""
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.runtime_context import publish, reset_context

    try:
        publish(sa, role="tokenizer")
        scheduler = SimpleNamespace(server_args=sa)
        Scheduler.init_deterministic_inference_config(scheduler)
        return scheduler.truncation_align_size
    finally:
        reset_context()


def twin_resolution(models, **extra):
    """What SGLang itself resolves for builtin EAGLE with the same flags (never refused by us)."""
    return resolve(**base_args(models, "EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
                               speculative_num_draft_tokens=4, **extra))


def test_refuses_chunked_prefill_below_the_alignment(models):
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, "DETSPEC_EAGLE", attention_backend="flashinfer", chunked_prefill_size=64))
    msg = str(info.value)
    for text in ("DETSPEC_EAGLE", "--chunked-prefill-size 64:", "flashinfer", "4096 tokens",
                 "SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", "never scheduled", "a multiple of 4096", "-1"):
        assert text in msg, msg


def test_refuses_chunked_prefill_off_the_alignment(models):
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, "DETSPEC_EAGLE3", attention_backend="flashinfer", chunked_prefill_size=5000))
    msg = str(info.value)
    for text in ("DETSPEC_EAGLE3", "--chunked-prefill-size 5000:", "start off the alignment", "a multiple of 4096",
                 "-1 to turn chunked prefill off"):
        assert text in msg, msg


def test_refuses_sglang_default_chunk_off_the_alignment(models, monkeypatch):
    monkeypatch.setenv("SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", "3000")
    default = compat.read_field(twin_resolution(models, attention_backend="flashinfer"), "chunked_prefill_size")
    assert default > 0 and default % 3000
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, "DETSPEC_EAGLE", attention_backend="flashinfer"))
    msg = str(info.value)
    assert f"--chunked-prefill-size {default} (SGLang's default for this GPU)" in msg and "3000 tokens" in msg, msg


def test_refuses_chunk_per_dp_attention_rank_off_the_alignment(models):
    dp = dict(attention_backend="flashinfer", tp_size=2, dp_size=2, enable_dp_attention=True)
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, "DETSPEC_EAGLE", chunked_prefill_size=4096, **dp))
    msg = str(info.value)
    assert "--chunked-prefill-size 4096 (resolved to 2048 per DP-attention rank, 2 ranks)" in msg, msg
    assert "a multiple of 8192" in msg, msg
    sa = resolve(**base_args(models, "DETSPEC_EAGLE", chunked_prefill_size=8192, **dp))
    assert compat.read_field(sa, "chunked_prefill_size") == 4096 == scheduler_alignment(sa)


def test_refuses_a_non_positive_alignment(models, monkeypatch):
    # The scheduler would divide by it (0) on the first chunked prompt.
    monkeypatch.setenv("SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", "0")
    with pytest.raises(DetspecConfigError, match="non-positive alignment.*Unset SGLANG_FLASHINFER_PREFILL_SPLIT_TILE"):
        resolve(**base_args(models, "DETSPEC_EAGLE", attention_backend="flashinfer", chunked_prefill_size=4096))
    assert compat.read_field(resolve(**base_args(models, "DETSPEC_EAGLE", attention_backend="flashinfer",
                                                 chunked_prefill_size=-1)), "chunked_prefill_size") == -1


@pytest.mark.parametrize("backend", ["flashinfer", "triton", "fa3"])
@pytest.mark.parametrize("chunk", [64, 2048, 4096, 5000, 8192, 12288, -1])
def test_chunk_sizes_refused_exactly_where_the_scheduler_would_misalign(models, backend, chunk):
    """Oracle: the installed scheduler's alignment for SGLang's own resolution of the same flags. Covers the
    release difference (triton aligned on 0.5.17 - 0.5.21 only) and the backends without an alignment."""
    flags = dict(attention_backend=backend, chunked_prefill_size=chunk)
    align = scheduler_alignment(twin_resolution(models, **flags))
    refused = align is not None and chunk > 0 and chunk % align != 0
    if refused:
        with pytest.raises(DetspecConfigError, match=f"--chunked-prefill-size {chunk}: .*{align} tokens"):
            resolve(**base_args(models, "DETSPEC_EAGLE", **flags))
    else:
        sa = resolve(**base_args(models, "DETSPEC_EAGLE", **flags))
        assert compat.read_field(sa, "chunked_prefill_size") == chunk


# --------------------------------------------------------------------------------------------------
# Multi-layer EAGLE with chunked prefill, PD disaggregation, simulated acceptance
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["model-override", "flag"])
def test_refuses_chunked_prefill_with_multi_layer_eagle(models, how):
    if how == "model-override":  # MiMo-V2: SGLang's override switches multi-layer EAGLE on
        flags = dict(model_path=models["mimo"], attention_backend="triton")
    else:
        flags = dict(enable_multi_layer_eagle=True, attention_backend="flashinfer")
    # Aligned chunk sizes, so only the multi-layer rule can refuse them.
    for chunk in (None, 8192):
        extra = {} if chunk is None else dict(chunked_prefill_size=chunk)
        with pytest.raises(DetspecConfigError) as info:
            resolve(**base_args(models, "DETSPEC_EAGLE", **flags, **extra))
        msg = str(info.value)
        assert "multi-layer EAGLE" in msg and "#26329" in msg and "Pass --chunked-prefill-size -1" in msg, msg
        assert (f"--chunked-prefill-size {chunk}" if chunk else "SGLang's default for this GPU") in msg, msg
    sa = resolve(**base_args(models, "DETSPEC_EAGLE", chunked_prefill_size=-1, disable_radix_cache=True, **flags))
    assert compat.read_field(sa, "enable_multi_layer_eagle") is True
    # The single-layer worker has upstream's fix: aligned chunked prefill stays allowed there.
    assert compat.read_field(resolve(**base_args(models, "DETSPEC_EAGLE", attention_backend="flashinfer",
                                                 chunked_prefill_size=8192)), "chunked_prefill_size") == 8192


@pytest.mark.parametrize("how", ["model-override", "flag"])
def test_refuses_the_radix_cache_with_multi_layer_eagle(models, how):
    # triton: under deterministic inference SGLang turns the radix cache off itself for backends outside
    # RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND (flashinfer among them), and then there is nothing to refuse.
    if how == "model-override":
        flags = dict(model_path=models["mimo"], attention_backend="triton")
    else:
        flags = dict(enable_multi_layer_eagle=True, attention_backend="triton")
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, "DETSPEC_EAGLE", chunked_prefill_size=-1, **flags))
    msg = str(info.value)
    assert "the radix cache and multi-layer EAGLE" in msg and "Pass --disable-radix-cache" in msg, msg
    # Single-layer EAGLE keeps the radix cache (its bigram keys cover the one token its draft layer reads ahead).
    sa = resolve(**base_args(models, "DETSPEC_EAGLE", attention_backend="triton", chunked_prefill_size=-1))
    assert compat.read_field(sa, "disable_radix_cache") is False
    assert compat.read_field(sa, "enable_multi_layer_eagle") is False


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("name", NAMES)
def test_refuses_pd_disaggregation(models, mode, name):
    import inspect

    from sglang.srt.speculative import eagle_disaggregation

    # What this release's decode side hands its first verify, read from its source.
    hands_over_q = "draft_probs" in inspect.getsource(eagle_disaggregation.build_eagle_disagg_draft_input)
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, name, disaggregation_mode=mode))
    msg = str(info.value)
    assert f"--disaggregation-mode {mode}" in msg and name in msg, msg
    assert ("with probability one" if hands_over_q else "no draft probabilities") in msg, msg
    assert "drop --disaggregation-mode" in msg, msg


@pytest.mark.parametrize("name", NAMES)
def test_refuses_simulated_acceptance(models, monkeypatch, name):
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3")
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, name))
    msg = str(info.value)
    assert "SGLANG_SIMULATE_ACC_LEN=3.0" in msg and name in msg and "global RNG" in msg, msg
    for off in ("-1", "0"):
        monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", off)
        assert compat.read_field(resolve(**base_args(models, name)), "speculative_algorithm") == name


@pytest.mark.parametrize("name", ["DETSPEC_EAGLE_INVARIANT", "DETSPEC_EAGLE3_INVARIANT"])
def test_the_split_kv_verify_is_refused_for_the_invariant_algorithms(models, monkeypatch, name):
    """Their verify must run in the decode kernel's order; the refusal names the variable and the rejection twin."""
    monkeypatch.setenv("SGLANG_DETSPEC_SPLIT_KV_VERIFY", "1")
    with pytest.raises(DetspecConfigError) as info:
        resolve(**base_args(models, name))
    msg = str(info.value)
    assert f"--speculative-algorithm {name} cannot be used with SGLANG_DETSPEC_SPLIT_KV_VERIFY=1" in msg, msg
    assert f"or use --speculative-algorithm {name[: -len('_INVARIANT')]}." in msg, msg


def test_the_split_kv_verify_resolves_for_detspec_eagle(models, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_SPLIT_KV_VERIFY", "1")
    assert compat.read_field(resolve(**base_args(models, "DETSPEC_EAGLE")), "speculative_algorithm") == "DETSPEC_EAGLE"
