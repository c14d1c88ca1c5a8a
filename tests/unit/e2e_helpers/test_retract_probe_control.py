"""The E2E harness's retraction-targeting control (tests/e2e/controls/retract_the_probe/sitecustomize.py) on CPU.

Its hook reorders the installed SGLang's own ``ScheduleBatch._get_decode_retraction_order`` (run here on plain
requests), so what the GPU pressure test relies on is checked on every release of the range: the target exists and
stays a staticmethod under SGLang's ``HookRegistry``, SGLang's order is kept when the probe is not eligible, and the
probe goes last -- where ``retract_decode`` pops first -- only with enough output tokens, a neighbour, and at most
the allowed number of times.
"""

import importlib.util
import inspect
from types import SimpleNamespace

import pytest

import e2e_harness as h

SEED = 1234


def _load_control():
    path = h.RETRACT_PROBE_CONTROL / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("retract_the_probe_control", path)  # not "sitecustomize": no hook
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _req(rid, outputs, prompt=8, seed=7):
    return SimpleNamespace(rid=rid, output_ids=list(range(outputs)), origin_input_ids=list(range(prompt)),
                           sampling_params=SimpleNamespace(sampling_seed=seed), priority=None)


@pytest.fixture
def upstream_order(monkeypatch):
    """SGLang's order as a function of the requests, and the extra arguments ``retract_decode`` passes it: 0.5.17 -
    0.5.18 pass ``server_args`` (``(reqs, server_args)``); 0.5.19 on pass the requests alone and read the policy from
    the scheduler's published ``get_schedule()`` config, which no server publishes here, so it is given the same
    non-priority policy (SGLang's length ordering is what every test reads)."""
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    policy = SimpleNamespace(retraction_policy="fcfs", schedule_low_priority_values_first=False)
    order = ScheduleBatch._get_decode_retraction_order  # a staticmethod: the plain function
    if len(inspect.signature(order).parameters) == 2:
        extra = (policy,)
    else:
        monkeypatch.setattr(schedule_batch, "get_schedule", lambda: policy)
        extra = ()
    return lambda reqs: order(reqs, *extra), extra


def test_the_target_is_sglangs_retraction_order_as_a_staticmethod():
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    control = _load_control()
    module_path, _, attr = control.TARGET.rpartition(".")
    assert module_path.endswith("ScheduleBatch") and attr == "_get_decode_retraction_order"
    assert isinstance(ScheduleBatch.__dict__[attr], staticmethod)  # HookRegistry re-wraps it as one


def test_the_probe_goes_last_once_eligible_and_at_most_times(upstream_order):
    order, extra = upstream_order
    control = _load_control()
    hook = control.make_hook(SEED, after=32, times=2)
    fillers = [_req("a", 5), _req("b", 50), _req("c", 0, prompt=30)]
    probe = _req("probe", 40, seed=SEED)
    reqs = [fillers[0], probe, fillers[1], fillers[2]]
    upstream = order(reqs)
    assert upstream[-1] == 3  # SGLang's own choice: the fewest output tokens (the rewound filler "c")
    for _ in range(2):
        got = hook(lambda r, *a: order(r), reqs, *extra)
        assert got[-1] == 1 and sorted(got) == [0, 1, 2, 3]
        assert got[:-1] == [i for i in upstream if i != 1]  # the rest keeps SGLang's order
    assert hook(lambda r, *a: order(r), reqs, *extra) == upstream  # the third time: SGLang's choice again


@pytest.mark.parametrize("case", ["too few outputs", "alone", "another seed"])
def test_sglangs_order_is_kept_where_the_probe_is_not_eligible(upstream_order, case):
    order, extra = upstream_order
    hook = _load_control().make_hook(SEED, after=32, times=2)
    probe = _req("probe", 31 if case == "too few outputs" else 40, seed=SEED + (case == "another seed"))
    reqs = [probe] if case == "alone" else [_req("a", 5), probe, _req("b", 50)]
    assert hook(lambda r, *a: order(r), reqs, *extra) == order(reqs)


def test_sglangs_hook_registry_applies_it_and_retract_decodes_order_puts_the_probe_last(monkeypatch, upstream_order):
    """The mechanism the GPU run relies on: registered as the server's sitecustomize does, applied by SGLang's
    ``HookRegistry.apply_hooks`` (what ``load_plugins`` calls), the method stays a staticmethod and the order
    ``retract_decode`` reads (``self._get_decode_retraction_order(self.reqs[, server_args])``) ends with the probe."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.plugins.hook_registry import HookRegistry

    _, extra = upstream_order
    control = _load_control()
    saved = ScheduleBatch.__dict__["_get_decode_retraction_order"]
    saved_hooks = {k: list(v) for k, v in HookRegistry._hooks.items()}
    saved_patched = set(HookRegistry._patched)
    monkeypatch.setenv(control.SEED_ENV, str(SEED))
    try:
        control._register_from_env()
        HookRegistry.apply_hooks()
        assert isinstance(ScheduleBatch.__dict__["_get_decode_retraction_order"], staticmethod)
        reqs = [_req("a", 5), _req("probe", 40, seed=SEED), _req("b", 50)]
        batch = object.__new__(ScheduleBatch)  # only the method lookup retract_decode does
        assert batch._get_decode_retraction_order(reqs, *extra)[-1] == 1
    finally:
        ScheduleBatch._get_decode_retraction_order = saved
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(saved_hooks)
        HookRegistry._patched.clear()
        HookRegistry._patched.update(saved_patched)


def test_registering_without_the_seed_fails_naming_it(monkeypatch):
    control = _load_control()
    monkeypatch.delenv(control.SEED_ENV, raising=False)
    with pytest.raises(RuntimeError, match=control.SEED_ENV):
        control._register_from_env()
