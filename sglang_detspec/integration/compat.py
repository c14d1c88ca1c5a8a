"""Everything that differs between the supported SGLang releases (0.5.17 .. 0.5.23), in one place.

Importing this module is cheap: it imports neither torch nor SGLang at module level, so
:mod:`sglang_detspec.integration` can run the version check before anything heavy is loaded. Every
function that needs SGLang imports it lazily.

Differences this module absorbs (verified against the installed 0.5.17 and 0.5.23 wheels)
-----------------------------------------------------------------------------------------

The releases in between were read (not run) from their PyPI wheels: 0.5.18 resolves in
``ServerArgs.__post_init__`` like 0.5.17; 0.5.19 to 0.5.22 resolve through ``resolve_once`` ->
``run_resolution_pipeline`` like 0.5.23 (0.5.20+ also have ``register_resolution_hook``). All of
0.5.17-0.5.22 refuse rejection sampling with ``--enable-deterministic-inference``; the plugin framework,
``SpeculativeAlgorithm.register`` and the scheduler's ``load_plugins()`` call are present in every one.
The probes below test for the feature, not the version number.

========================================  ===================================  ====================================
what                                      0.5.17                               0.5.23
========================================  ===================================  ====================================
where server arguments are resolved       ``ServerArgs.__post_init__`` (a      ``ServerArgs.resolve_once`` ->
                                          dataclass; handlers *assign* fields, ``arg_groups.pipeline.
                                          then ``materialize_declarations``)   run_resolution_pipeline`` (a
                                                                               record; handlers *declare*,
                                                                               fields keep the raw input)
reading a resolved field                  ``resolved_view(sa).<field>`` mid-   ``resolving_view(sa).<field>``
                                          resolution, ``server_args.<field>``
                                          after
writing a field during resolution         ``setattr`` (``override`` once       ``declare_resolution(...)``
                                          ``__post_init__`` sealed the record)
resolution-step plugin hooks              none                                 ``register_resolution_hook``
model config during resolution            ``server_args.get_model_config()``   ``model_config_of(server_args)``
multi-layer switch ``create_worker``      ``server_args.enable_multi_layer_    ``resolving_view(sa).enable_multi_
reads                                     eagle``                              layer_eagle``
RS + ``--enable-deterministic-inference`` refused in ``_handle_eagle_family``  allowed on CUDA (seeded in-tree)
``SpeculativeAlgorithm.from_string``      no NEXTN alias (resolved earlier)    NEXTN -> EAGLE
``CustomSpecAlgo.build_disagg_draft_      ``(batch, server_args, last_tokens,  ``(batch, last_tokens, future_map)``
input``                                   future_map)``
``get_platform_worker_cls``               does not exist                       called by adaptive-spec checks
``supports_mixed_chunk`` /                do not exist                         exist (EAGLE/EAGLE3 keep mixed
``supports_prefill_shared_read_done`` /                                        chunk on)
``is_uno`` / ``resolve_max_speculative_
num_draft_tokens``
spec fields only in 0.5.23                                                     ``speculative_use_block_verification``,
                                                                               ``enable_watermark``,
                                                                               ``enable_return_aux_hidden_states``
``/generate`` body schema gate            none (0.5.17 - 0.5.21)               ``api_contract.generate_contract_
                                                                               error`` (0.5.22+): type errors and
                                                                               unknown fields get HTTP 400
                                                                               ``{"error": "<schema text>"}``
                                                                               before any plugin hook runs
deterministic chunked-prefill alignment   flashinfer and triton (to 0.5.21);   flashinfer only (0.5.22+), keyed by
(``Scheduler.truncation_align_size``)     keyed by ``attention_backend``       the prefill backend; a chunk below
                                          (0.5.18+: the prefill backend); a    it raises at scheduler init
                                          chunk below the alignment hangs      (0.5.22+)
========================================  ===================================  ====================================

Also different: 0.5.17 seals ``ServerArgs`` when ``__post_init__`` ends (assigning a field raises;
``server_args.override(source, **fields)`` is the write path; 0.5.18 names it ``_late_resolution``), while
0.5.23 records never change their fields; 0.5.17's scheduler passes ``create_worker`` a deep copy of the record (``draft_server_args_copy``),
0.5.23 the record itself; ``ServerArgs``' field names come from ``dataclasses.fields`` on 0.5.17 and from
``arg_utils.record_fields`` from 0.5.20 on.

The same in both: the plugin framework (``sglang.srt.plugins.load_plugins``, ``HookRegistry``; only
formatting differs), ``SpeculativeAlgorithm.register`` and the registry's checks (reserved names, duplicates,
the ``is_*`` / ``supports_*`` conformance check), the scheduler / model-runner / worker processes calling
``load_plugins()`` before they look an algorithm up, and ``CustomSpecAlgo.create_worker`` refusing overlap
scheduling unless ``supports_overlap=True``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import logging
import os
import re
from typing import Any, NamedTuple, Optional, Tuple

logger = logging.getLogger(__name__)

#: Inclusive range of SGLang releases this plugin supports.
SUPPORTED_MIN: Tuple[int, int, int] = (0, 5, 17)
SUPPORTED_MAX: Tuple[int, int, int] = (0, 5, 23)
SUPPORTED_RANGE_TEXT = f"sglang {'.'.join(map(str, SUPPORTED_MIN))} to {'.'.join(map(str, SUPPORTED_MAX))} (inclusive)"

#: Set to 1 to downgrade the version refusal to a warning (for trying a newer SGLang; unsupported).
SKIP_VERSION_CHECK_ENV = "SGLANG_DETSPEC_SKIP_VERSION_CHECK"

_MISSING = object()


class UnsupportedSGLangVersion(ImportError):
    """The installed SGLang is outside :data:`SUPPORTED_RANGE_TEXT`."""


# ---------------------------------------------------------------------------------------------------
# Version
# ---------------------------------------------------------------------------------------------------


def parse_version(text: str) -> Tuple[int, int, int]:
    """``"0.5.23"`` / ``"0.5.23.post1"`` / ``"0.5.24rc1"`` -> ``(0, 5, 23)`` / ``(0, 5, 23)`` / ``(0, 5, 24)``.

    Only the release triple matters for support; a post-release of a supported version is supported and a
    pre-release of the next one is not.
    """
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not m:
        raise ValueError(f"cannot parse an SGLang version from {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def installed_sglang_version() -> Optional[str]:
    """The installed SGLang's version string, or None when SGLang is not installed.

    Reads package metadata, so it does not import SGLang (importing it takes seconds).
    """
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        pass
    # A source checkout on sys.path without dist-info: fall back to the module (slow path, rare).
    if importlib.util.find_spec("sglang") is None:
        return None
    import sglang  # noqa: PLC0415

    return getattr(sglang, "__version__", None)


def check_sglang_version(*, required: bool) -> Optional[Tuple[int, int, int]]:
    """Refuse an SGLang outside the supported range; return the parsed version (None if not installed).

    ``required=False`` tolerates a missing SGLang: the Triton kernel and the proposal dispatcher are usable
    without it (the GPU test machine has no SGLang). A *present* but unsupported SGLang is always refused,
    unless ``SGLANG_DETSPEC_SKIP_VERSION_CHECK=1``.
    """
    text = installed_sglang_version()
    if text is None:
        if required:
            raise UnsupportedSGLangVersion(
                f"sglang-detspec needs SGLang installed ({SUPPORTED_RANGE_TEXT}); it is not. "
                'Install a supported release, e.g. `pip install "sglang==0.5.23"`.'
            )
        return None
    version = parse_version(text)
    if SUPPORTED_MIN <= version <= SUPPORTED_MAX:
        return version
    message = (
        f"sglang-detspec supports {SUPPORTED_RANGE_TEXT}, but sglang {text} is installed. "
        'Install a supported release (e.g. `pip install "sglang==0.5.23"`), or set '
        f"{SKIP_VERSION_CHECK_ENV}=1 to try anyway (unsupported: the plugin reaches into SGLang internals "
        "that change between releases)."
    )
    if os.environ.get(SKIP_VERSION_CHECK_ENV, "") not in ("", "0"):
        logger.warning("%s (continuing because %s is set)", message, SKIP_VERSION_CHECK_ENV)
        return version
    raise UnsupportedSGLangVersion(message)


# ---------------------------------------------------------------------------------------------------
# Server-argument resolution
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def uses_resolution_pipeline() -> bool:
    """True where ``ServerArgs.resolve_once`` runs ``arg_groups.pipeline`` (0.5.23); False where
    ``ServerArgs.__post_init__`` resolves in place (0.5.17)."""
    from sglang.srt.server_args import ServerArgs

    return hasattr(ServerArgs, "resolve_once") and importlib.util.find_spec("sglang.srt.arg_groups.pipeline") is not None


def resolution_entry_target() -> str:
    """Dotted path of the one function that runs a whole server-argument resolution.

    The plugin wraps it (``HookRegistry`` AROUND) so that every resolution step sees the EAGLE twin name.
    Both callers look the target up at call time, so the ``HookRegistry`` patch reaches them:
    ``resolve_once`` imports ``run_resolution_pipeline`` inside its body, and a dataclass ``__init__`` calls
    ``self.__post_init__()`` through the class.
    """
    if uses_resolution_pipeline():
        return "sglang.srt.arg_groups.pipeline.run_resolution_pipeline"
    return "sglang.srt.server_args.ServerArgs.__post_init__"


def read_field(server_args: Any, name: str, default: Any = _MISSING) -> Any:
    """The value resolution has decided so far for ``name`` (the raw input before any step ran).

    ``default`` is returned for a field this SGLang release does not have; without it that raises
    AttributeError.
    """
    view = server_args
    if uses_resolution_pipeline():
        from sglang.srt.arg_groups.overrides import resolving_view

        view = resolving_view(server_args)
    elif _mid_resolution_0517(server_args):
        # 0.5.17 handlers assign most fields but some passes only declare (materialized at the end of
        # __post_init__); the overlay shows both.
        from sglang.srt.arg_groups.overrides import resolved_view

        view = resolved_view(server_args)
    try:
        return getattr(view, name)
    except AttributeError:
        if default is _MISSING:
            raise
        return default


def has_field(server_args: Any, name: str) -> bool:
    """Whether this SGLang release's ServerArgs has a field called ``name``."""
    absent = object()
    return read_field(server_args, name, absent) is not absent


def write_fields(server_args: Any, source: str, **fields: Any) -> None:
    """Decide ``fields`` the way this release's resolution does: a declaration (0.5.23) or an assignment
    (0.5.17). ``source`` names the decision in 0.5.23's resolution log."""
    if not fields:
        return
    if uses_resolution_pipeline():
        from sglang.srt.arg_groups.overrides import declare_resolution

        declare_resolution(server_args, source, **fields)
        return
    for name in fields:
        if not hasattr(server_args, name):
            raise AttributeError(f"{source}: {name!r} is not a ServerArgs field")
    if getattr(server_args, "_declarations_materialized", False):
        # __post_init__ releases seal the record once its declarations are materialized. The sanctioned
        # pre-publish write is ``override`` in 0.5.17 (it also records resolvable fields for a republish)
        # and ``_late_resolution`` in 0.5.18 (checked in the 0.5.18 wheel; 0.5.19+ resolve via the pipeline).
        for method in ("override", "_late_resolution"):
            write = getattr(server_args, method, None)
            if callable(write):
                write(source, **fields)
                return
        raise RuntimeError(
            f"{source}: this SGLang release sealed ServerArgs and offers no known write path "
            "(override / _late_resolution)"
        )
    for name, value in fields.items():
        setattr(server_args, name, value)


def _mid_resolution_0517(server_args: Any) -> bool:
    return getattr(server_args, "_resolved_overrides", None) is not None and not getattr(
        server_args, "_declarations_materialized", False
    )


def model_config(server_args: Any) -> Any:
    """The target ``ModelConfig`` as resolution builds it (memoized by SGLang on the record)."""
    if uses_resolution_pipeline():
        from sglang.srt.arg_groups.overrides import model_config_of

        return model_config_of(server_args)
    return server_args.get_model_config()


def multi_layer_eagle_enabled(server_args: Any) -> bool:
    """What upstream ``SpeculativeAlgorithm.create_worker`` reads to choose the multi-layer worker."""
    return bool(read_field(server_args, "enable_multi_layer_eagle", False))


# ---------------------------------------------------------------------------------------------------
# Chunked prefill under deterministic inference
# ---------------------------------------------------------------------------------------------------


class PrefillAlignment(NamedTuple):
    """The alignment the scheduler imposes on chunked prefill (``Scheduler.truncation_align_size``)."""

    tokens: int
    env_var: str  # the variable that sets it
    backend: str  # the prefill attention backend it belongs to


#: ``Scheduler.init_deterministic_inference_config``'s table (the same default, 4096, in every release).
_PREFILL_ALIGNMENT_ENV = {
    "flashinfer": "SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE",
    "triton": "SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE",
}
_PREFILL_ALIGNMENT_DEFAULT = 4096


def scheduler_prefill_backend(server_args: Any) -> Optional[str]:
    """The attention backend the scheduler looks its prefill alignment up by.

    0.5.17 reads ``server_args.attention_backend`` (``--prefill-attention-backend`` is ignored there);
    0.5.18+ read the prefill half of ``runtime_context.attention_backends()`` (``--prefill-attention-backend``,
    else ``--attention-backend``). Probed by that function's presence.
    """
    from sglang.srt import runtime_context

    base = read_field(server_args, "attention_backend", None)
    if not hasattr(runtime_context, "attention_backends"):
        return base
    return read_field(server_args, "prefill_attention_backend", None) or base


def deterministic_prefill_alignment(server_args: Any) -> Optional[PrefillAlignment]:
    """What ``Scheduler.init_deterministic_inference_config`` will set ``truncation_align_size`` to, or None.

    None without ``--enable-deterministic-inference`` or for a prefill backend without an alignment. flashinfer
    is aligned on every release; triton on 0.5.17 - 0.5.21 only (0.5.22 tiles keys at absolute positions and
    deprecated ``SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE``; probed by that variable still being declared in
    ``sglang.srt.environ.envs``). The value is read with the scheduler's own parser (``get_int_env_var``).
    Model-specific alignments the scheduler folds in later by LCM (DeepSeek DSA index k-pool 0.5.20+, Mamba
    chunk grid under DCP 0.5.23) are not included.
    """
    if not read_field(server_args, "enable_deterministic_inference", False):
        return None
    backend = scheduler_prefill_backend(server_args)
    env_var = _PREFILL_ALIGNMENT_ENV.get(backend)
    if env_var is None:
        return None
    if backend == "triton":
        from sglang.srt.environ import envs

        if not hasattr(envs, env_var):
            return None
    from sglang.srt.utils import get_int_env_var

    return PrefillAlignment(get_int_env_var(env_var, _PREFILL_ALIGNMENT_DEFAULT), env_var, backend)


def attention_dp_size(server_args: Any) -> int:
    """Number of DP-attention ranks the resolved ``--chunked-prefill-size`` was divided by (1 without DP
    attention): ``attn_dp_size`` on 0.5.22+, ``dp_size`` with ``--enable-dp-attention`` before."""
    size = read_field(server_args, "attn_dp_size", None)
    if size is not None:
        return int(size)
    return int(read_field(server_args, "dp_size", 1) or 1) if read_field(server_args, "enable_dp_attention", False) else 1


def pd_decode_first_proposal_is_one_hot() -> bool:
    """How a PD decode server builds a request's first draft input (``build_eagle_disagg_draft_input``).

    True on 0.5.22+: it proposes the draft token handed over by the prefill server with probability one
    (``pd_first_draft_proposal``). False on 0.5.17 - 0.5.21: it sets no ``draft_probs`` at all, and the first
    draft step stacks that missing proposal with its own (``draft_probs_list = [spec_info.draft_probs]``).
    """
    from sglang.srt.speculative import eagle_disaggregation

    return hasattr(eagle_disaggregation, "pd_first_draft_proposal")


# ---------------------------------------------------------------------------------------------------
# Speculative-algorithm interface
# ---------------------------------------------------------------------------------------------------


def enum_interface_methods() -> dict:
    """Every plain method the ``SpeculativeAlgorithm`` enum defines in this release, by name.

    ``from_string`` may return a builtin member or a registered ``CustomSpecAlgo``, and SGLang calls these
    methods on either without isinstance checks, so a registered class must answer all of them. The set
    differs per release (see the module docstring), hence it is read from the installed enum.
    """
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    members = set(SpeculativeAlgorithm.__members__)
    out = {}
    for name, value in vars(SpeculativeAlgorithm).items():
        if name.startswith("_") or name in members:
            continue
        if isinstance(value, (classmethod, staticmethod, property)):
            continue
        if callable(value):
            out[name] = value
    return out


# ---------------------------------------------------------------------------------------------------
# Draft sampling: the draft CUDA-graph runner's buffers
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def draft_graph_runner_owns_sampling_buffers() -> bool:
    """Whether ``EAGLEDraftCudaGraphRunner`` owns per-row ``sampling_seed`` / ``top_ks`` graph buffers.

    0.5.23: yes (``EagleDraftInputBuffers.sampling_seed`` under deterministic RS, ``runner.top_ks``
    always; both refreshed in ``execute``). 0.5.17: no; its ``capture_one_shape`` builds the captured
    ``SamplingBatchInfo`` without a seed and with a fresh all-``-1`` ``top_ks``, so the DETSPEC runner
    must supply both.
    """
    import dataclasses

    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EagleDraftInputBuffers

    return "sampling_seed" in {f.name for f in dataclasses.fields(EagleDraftInputBuffers)}


# ---------------------------------------------------------------------------------------------------
# The target's seeded race (what the coupled verify must reproduce bit for bit)
# ---------------------------------------------------------------------------------------------------

# The statement ``x.log_().clamp_(min=..., max=...)`` on one line (code only, comments dropped).
_LOG_U_CLAMP = re.compile(r"\.log_\(\)\.clamp_\((?P<args>.*)\)\.neg_\(\)")


@functools.lru_cache(maxsize=None)
def seeded_race_caps_unit_uniform() -> bool:
    """Whether SGLang's ``multinomial_with_seed`` clamps ``log(u)`` from above (at ``-2**-32``).

    0.5.17 clamps it from below only, so a hash of ``2**32 - 1`` gives ``u = 1`` and Gumbel noise ``+inf``;
    0.5.18 - 0.5.23 also clamp from above (read in the installed 0.5.17 / 0.5.23 sources and the 0.5.18 - 0.5.21
    wheels). Decided from the installed function's source, not the version number; a body with neither form
    raises, because the coupled verify would then race different noise from the sampler it must reproduce.
    """
    import inspect

    from sglang.srt.layers import sampler

    fn = sampler.multinomial_with_seed
    fn = getattr(fn, "_torchdynamo_orig_callable", fn)  # 0.5.23 wraps it in torch.compile
    code = [line.split("#", 1)[0] for line in inspect.getsource(inspect.unwrap(fn)).splitlines()]
    clamps = [m.group("args") for m in map(_LOG_U_CLAMP.search, code) if m]
    if len(clamps) == 1 and "min=" in clamps[0].replace(" ", ""):
        return "max=" in clamps[0].replace(" ", "")
    raise RuntimeError(
        "sglang-detspec: SGLang's multinomial_with_seed no longer clamps log(u) the way 0.5.17 - 0.5.23 do; the "
        "speculation-invariant verify cannot reproduce its noise. sglang-detspec needs updating for this SGLang "
        "version (use --speculative-algorithm DETSPEC_EAGLE meanwhile)"
    )


# ---------------------------------------------------------------------------------------------------
# Verify attention (the invariant verify's decode-order target attention)
# ---------------------------------------------------------------------------------------------------

#: Where upstream's ``create_flashinfer_kv_indices_triton`` lives (moved in 0.5.23); the Triton backend itself
#: stopped calling it in 0.5.18 (its KV index translator packs the reads), but the kernel is unchanged.
_KV_INDICES_MODULES = ("sglang.kernels.ops.kvcache.kv_indices", "sglang.kernels.ops.attention.kv_indices")


def kv_indices_kernel() -> Any:
    """Upstream's Triton kernel that copies ``req_to_token[req, start : start + len]`` rows into a packed stream."""
    for name in _KV_INDICES_MODULES:
        if importlib.util.find_spec(name) is not None:
            return importlib.import_module(name).create_flashinfer_kv_indices_triton
    raise RuntimeError(f"none of {_KV_INDICES_MODULES} exists; sglang-detspec needs updating for this SGLang version")


def attention_reads_translated(backend: Any) -> bool:
    """Whether ``backend``'s kernels index the K/V pool with ids other than ``req_to_token``'s (a unified pool):
    0.5.17 sets ``_translate_kv_loc``; 0.5.18+ ask the backend's ``kv_index_translator``."""
    translator = getattr(backend, "kv_index_translator", None)
    if translator is not None:
        return bool(translator.reads_are_translated)
    return getattr(backend, "_translate_kv_loc", None) is not None


# ---------------------------------------------------------------------------------------------------
# Request schema
# ---------------------------------------------------------------------------------------------------

_GENERATE_CONTRACT_MODULE = "sglang.srt.entrypoints.api_contract"


def generate_schema_gate() -> Optional[Any]:
    """SGLang's own ``/generate`` JSON schema check (0.5.22+), ``body -> error text or None``; None where the release
    has none. It answers before the plugin's request checks, with its own wording (``invalid type: string "3",
    expected i64``), so on those releases a type error on ``/generate`` is SGLang's refusal, not the plugin's."""
    if importlib.util.find_spec(_GENERATE_CONTRACT_MODULE) is None:
        return None
    return importlib.import_module(_GENERATE_CONTRACT_MODULE).generate_contract_error


def server_args_field_names() -> Tuple[str, ...]:
    """The names of ``ServerArgs``' fields (``ServerArgs(**kwargs)`` / ``Engine(**kwargs)`` take exactly these): a
    dataclass on 0.5.17 - 0.5.19, a record read by ``record_fields`` from 0.5.20 on."""
    from sglang.srt import server_args as module

    cls = module.ServerArgs
    record_fields = getattr(module, "record_fields", None)
    if record_fields is not None and not dataclasses.is_dataclass(cls):
        return tuple(f.name for f in record_fields(cls))
    return tuple(f.name for f in dataclasses.fields(cls))
