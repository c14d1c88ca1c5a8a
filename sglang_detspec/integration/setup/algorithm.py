"""The registered speculative algorithms ``DETSPEC_EAGLE`` / ``DETSPEC_EAGLE3`` and their speculation-invariant
twins ``DETSPEC_EAGLE_INVARIANT`` / ``DETSPEC_EAGLE3_INVARIANT``.

The invariant names run the same workers with the coupled proposal and verify (:mod:`.scheme`); everything below
holds for all four.

Registered through SGLang's plugin hook :meth:`SpeculativeAlgorithm.register` (present, and identical, in
0.5.17 and 0.5.23). ``SpeculativeAlgorithm.from_string("DETSPEC_EAGLE")`` then returns a
:class:`DetspecEagleAlgo` instance, and every scheduler / memory-pool / CUDA-graph site that asks the
algorithm object a question gets the answer the builtin twin (``SpeculativeAlgorithm.EAGLE`` or ``.EAGLE3``)
would give:

* ``is_eagle()`` is True for both names and ``is_eagle3()`` for ``DETSPEC_EAGLE3``; these two predicates
  drive draft-KV pool sizing, target hidden-state capture, the target-verify CUDA-graph dummy input, the
  decode/prefill graph runners, FutureMap staging, DP attention and PD transfer (about 30 call sites);
* the four methods the scheduler calls that ``CustomSpecAlgo`` lacks (``carries_draft_hidden_states``,
  ``create_future_map``, ``need_topk``, and on 0.5.23 ``get_platform_worker_cls``) are implemented;
* ``create_future_map`` / ``build_disagg_draft_input`` run the enum's own implementation with ``self`` =
  this object, so the EAGLE branches inside them are taken through our ``is_eagle()`` (and the FutureMap
  keeps a reference to *this* algorithm, not to the twin);
* any other plain method the installed enum has and ``CustomSpecAlgo`` does not (a release in between may
  add one) is filled in the same way when the class is registered (:func:`_fill_interface`): the enum's
  implementation called with ``self`` = this object. Identity tests inside such a method
  (``self == SpeculativeAlgorithm.X``) answer False, ``is_*()`` calls answer as above.

Deliberate differences from the twin: ``supports_mixed_chunk()`` is False (mixed chunked prefill makes the
output depend on co-scheduled prefills, so the server-argument handler refuses it; False makes any upstream
path that consults the algorithm disable it too) and ``get_platform_worker_cls()`` is None (the DETSPEC
workers must run; out-of-tree platforms are refused at startup).

Server arguments are not handled here: the whole resolution runs under the twin's name (see
:mod:`sglang_detspec.integration.setup.server_args`), so upstream's EAGLE handler does the work and this class's
``validate_server_args`` / ``handle_server_args`` are never reached. If they are, the resolution hook is not
active, and they raise instead of letting the server start half-configured.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, Optional, Type

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sglang_detspec.algorithm_names import DETSPEC_TWINS
from sglang_detspec.integration import compat
from sglang_detspec.integration.sampling import scheme

logger = logging.getLogger(__name__)

__all__ = [
    "ALGORITHM_CLASSES",
    "DetspecEagle3Algo",
    "DetspecEagle3InvariantAlgo",
    "DetspecEagleAlgo",
    "DetspecEagleInvariantAlgo",
    "DetspecSpecAlgo",
    "ResolutionHookInactive",
    "detspec_worker_factory",
    "lookup",
    "register_algorithms",
    "verify_registration",
    "builtin_algorithm",
]


class ResolutionHookInactive(RuntimeError):
    """SGLang resolved a DETSPEC name without the plugin's resolution hook in place."""


def builtin_algorithm(name: str) -> Any:
    """The builtin ``SpeculativeAlgorithm`` member called ``name`` (``"EAGLE"`` / ``"EAGLE3"``; the same on every release)."""
    return SpeculativeAlgorithm[name]


def _enum_impl(name: str) -> Callable[..., Any]:
    fn = compat.enum_interface_methods().get(name)
    if fn is None:
        raise AttributeError(f"SpeculativeAlgorithm in this SGLang release has no method {name!r}")
    return fn


def detspec_worker_factory(server_args: Any) -> Type:
    """The worker class for a DETSPEC algorithm (``SpeculativeAlgorithm.register``'s factory).

    Mirrors upstream ``SpeculativeAlgorithm.create_worker``: the EAGLE family uses the multi-layer worker
    when ``enable_multi_layer_eagle`` resolved True (set by ``--enable-multi-layer-eagle`` or by a model
    override, e.g. MiMo-V2 / Step-3.5 / GigaChat-3.5 MTP), for EAGLE3 drafts too; otherwise the
    single-layer worker (EAGLE, NEXTN-style MTP, EAGLE3).

    The worker modules import SGLang's whole speculative stack, so they are imported here, at call time
    (inside the scheduler process), not when the plugin registers.

    The factory also fixes the process's verify scheme (:mod:`.scheme`) from the algorithm name: the coupled race
    for ``DETSPEC_*_INVARIANT``, rejection sampling otherwise. A name that is not one of ours here means the
    resolution hook did not put the DETSPEC name back, and the worker would not know which scheme it serves.
    """
    name = str(compat.read_field(server_args, "speculative_algorithm", "") or "").upper()
    if name not in DETSPEC_TWINS:
        raise RuntimeError(
            f"sglang-detspec: the DETSPEC worker factory was called with --speculative-algorithm {name or None!r}, "
            f"not one of {sorted(DETSPEC_TWINS)}; the plugin's server-argument resolution did not finish. "
            "sglang-detspec needs updating for this SGLang version"
        )
    scheme.select(scheme.scheme_for_algorithm(name))
    from sglang_detspec.integration.workers.spec_workers import (
        DetspecEAGLEWorkerV2,
        DetspecMultiLayerEagleWorkerV2,
    )

    if compat.multi_layer_eagle_enabled(server_args):
        return DetspecMultiLayerEagleWorkerV2
    return DetspecEAGLEWorkerV2


def _resolution_guard(server_args: Any) -> None:
    """``validate_server_args`` of both algorithms: reaching it means the resolution hook did not run.

    With the hook active, upstream's speculative handler sees the twin name (EAGLE / EAGLE3), dispatches to
    the builtin EAGLE handler and never calls a registered algorithm's callbacks.
    """
    raise ResolutionHookInactive(
        "sglang-detspec: a DETSPEC speculative algorithm reached SGLang's custom-algorithm handler, which "
        "means the plugin's server-argument resolution hook is not active (HookRegistry did not apply it; "
        "look for 'Failed to apply hooks' or 'Failed to execute general plugin: detspec' in the log). "
        "Start SGLang through `sglang serve` / `python -m sglang.launch_server` / `sglang.Engine`, or call "
        "`sglang.srt.plugins.load_plugins()` before building ServerArgs, and make sure SGLANG_PLUGINS (if "
        "set) includes `detspec`."
    )


class DetspecSpecAlgo(CustomSpecAlgo):
    """Common base: an EAGLE-family algorithm whose draft proposals are seeded (see module docstring)."""

    #: Name of the builtin ``SpeculativeAlgorithm`` member this algorithm behaves like.
    TWIN: str = "EAGLE"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, twin={self.TWIN})"

    @property
    def twin(self) -> Any:
        """The builtin ``SpeculativeAlgorithm`` member this algorithm behaves like."""
        return builtin_algorithm(self.TWIN)

    # --- predicates the scheduler, pools and graph runners dispatch on -------------------------------
    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        return self.TWIN == "EAGLE3"

    def supports_grammar_overlap(self) -> bool:
        # The DETSPEC workers are EAGLEWorkerV2 subclasses and keep its verify(), grammar barrier included.
        return True

    def supports_mixed_chunk(self) -> bool:
        # Mixed steps sample running spec requests with the target Sampler instead of verify, so the tokens
        # would depend on whether a prefill was co-scheduled. Refused at startup; False keeps it off even if
        # some path enables it after resolution.
        return False

    def has_draft_kv(self) -> bool:
        return True

    # --- the four scheduler-called methods CustomSpecAlgo lacks --------------------------------------
    def carries_draft_hidden_states(self) -> bool:
        # PD transfer carries EAGLE draft hidden states (Scheduler.init_disaggregation calls this for every
        # scheduler, PD or not).
        return True

    def need_topk(self) -> bool:
        # FutureMap stages topk_p / topk_index for the EAGLE family.
        return True

    def get_platform_worker_cls(self) -> Optional[type]:
        # Never substitute a platform worker: the seeded draft stream lives in the DETSPEC workers.
        return None

    def create_future_map(self, *args: Any, **kwargs: Any) -> Any:
        return _enum_impl("create_future_map")(self, *args, **kwargs)

    def build_disagg_draft_input(self, *args: Any, **kwargs: Any) -> Any:
        # 0.5.17 passes (batch, server_args, last_tokens, future_map), 0.5.23 (batch, last_tokens, future_map).
        return _enum_impl("build_disagg_draft_input")(self, *args, **kwargs)

    # --- server arguments: handled by the resolution hook, never here --------------------------------
    def handle_server_args(self, server_args: Any) -> None:
        _resolution_guard(server_args)


class DetspecEagleAlgo(DetspecSpecAlgo):
    """``DETSPEC_EAGLE``: EAGLE / EAGLE-2 drafts and NEXTN-style MTP (single- or multi-layer)."""

    TWIN = "EAGLE"


class DetspecEagle3Algo(DetspecSpecAlgo):
    """``DETSPEC_EAGLE3``: EAGLE-3 drafts (full target vocabulary only)."""

    TWIN = "EAGLE3"


class DetspecEagleInvariantAlgo(DetspecEagleAlgo):
    """``DETSPEC_EAGLE_INVARIANT``: ``DETSPEC_EAGLE`` with the coupled race, so speculation never changes a token."""


class DetspecEagle3InvariantAlgo(DetspecEagle3Algo):
    """``DETSPEC_EAGLE3_INVARIANT``: the EAGLE-3 twin of ``DETSPEC_EAGLE_INVARIANT``."""


ALGORITHM_CLASSES: Dict[str, Type[DetspecSpecAlgo]] = {
    "DETSPEC_EAGLE": DetspecEagleAlgo,
    "DETSPEC_EAGLE3": DetspecEagle3Algo,
    "DETSPEC_EAGLE_INVARIANT": DetspecEagleInvariantAlgo,
    "DETSPEC_EAGLE3_INVARIANT": DetspecEagle3InvariantAlgo,
}

# Methods never filled from the enum: registration / lookup class methods and the ones whose enum body
# would pick builtin workers or handlers.
_NOT_DELEGATED = frozenset({"from_string", "register", "create_worker", "handle_server_args"})


def _make_delegate(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def delegate(self, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **kwargs)

    delegate.__detspec_delegated__ = True  # type: ignore[attr-defined]
    return delegate


def _fill_interface(cls: Type[DetspecSpecAlgo]) -> list:
    """Give ``cls`` every plain method of the installed enum it does not have yet (see module docstring).

    Returns the names filled in. Idempotent.
    """
    filled = []
    for name, fn in compat.enum_interface_methods().items():
        if name in _NOT_DELEGATED or hasattr(cls, name):
            continue
        setattr(cls, name, _make_delegate(name, fn))
        filled.append(name)
    if filled:
        logger.info("sglang-detspec: %s answers %s like the EAGLE family (enum implementation)", cls.__name__, filled)
    return filled


def lookup(name: str) -> Optional[Any]:
    """The algorithm registered under ``name`` in this process, or None."""
    try:
        algo = SpeculativeAlgorithm.from_string(name)
    except ValueError:
        return None
    return algo


def register_algorithms() -> Dict[str, DetspecSpecAlgo]:
    """Register every DETSPEC name with ``SpeculativeAlgorithm.register``; a no-op for names already ours.

    SGLang runs the plugin function once per process (``load_plugins`` guards itself) and every spawned
    scheduler / DP controller / detokenizer process runs it again in its own registry; calling this twice in
    one process must not raise (``register`` refuses duplicates). A name registered by someone else is an
    error: the server would silently run a different algorithm.
    """
    out: Dict[str, DetspecSpecAlgo] = {}
    for name, cls in ALGORITHM_CLASSES.items():
        _fill_interface(cls)
        existing = lookup(name)
        if existing is None:
            SpeculativeAlgorithm.register(
                name,
                supports_overlap=True,
                validate_server_args=_resolution_guard,
                spec_class=cls,
            )(detspec_worker_factory)
            existing = lookup(name)
        elif not isinstance(existing, cls):
            raise RuntimeError(
                f"sglang-detspec: speculative algorithm {name} is already registered by something else "
                f"({existing!r}); uninstall the other plugin or restrict SGLANG_PLUGINS to one of them."
            )
        out[name] = existing
    return out


def verify_registration() -> Dict[str, DetspecSpecAlgo]:
    """Self-check: each name resolves, to our class, with the EAGLE-family answers and the full interface.

    Raises RuntimeError naming what is wrong (the plugin loader only logs exceptions, so ``load_plugin`` logs
    and re-raises this).
    """
    interface = set(compat.enum_interface_methods())
    out = {}
    for name, cls in ALGORITHM_CLASSES.items():
        algo = lookup(name)
        problems = []
        if algo is None:
            problems.append("SpeculativeAlgorithm.from_string does not know it")
        else:
            if not isinstance(algo, cls):
                problems.append(f"resolves to {algo!r}, not a {cls.__name__}")
            if getattr(algo, "name", None) != name:
                problems.append(f"has name {getattr(algo, 'name', None)!r}")
            if getattr(algo, "factory", None) is not detspec_worker_factory:
                problems.append("has a different worker factory")
            if not getattr(algo, "supports_overlap", False):
                problems.append("is registered without overlap support")
            if algo.is_none() or not algo.is_speculative() or not algo.is_eagle():
                problems.append("does not answer like an EAGLE-family algorithm")
            if algo.is_eagle3() != (cls.TWIN == "EAGLE3"):
                problems.append(f"is_eagle3() is {algo.is_eagle3()}")
            missing = sorted(interface - set(dir(type(algo))))
            if missing:
                problems.append(f"lacks SpeculativeAlgorithm methods {missing}")
        if problems:
            raise RuntimeError(f"sglang-detspec: registration self-check failed for {name}: " + "; ".join(problems))
        out[name] = algo
    return out
