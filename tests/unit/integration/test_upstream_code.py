"""``upstream_code.rebind``: names replaced where a body reads them as globals *and* where it imports them.

SGLang 0.5.17 - 0.5.22 import the verify renorm kernels inside ``eagle_sample`` (``from sgl_kernel import ...``),
0.5.23 at module level; the DETSPEC verify relies on both being replaced, and on nothing else changing.
"""

from __future__ import annotations

import json
import textwrap
import types

import pytest

from sglang_detspec.integration.upstream_code import ReboundMethods, Site, imported_names, rebind


def _module(source: str) -> types.ModuleType:
    mod = types.ModuleType("fake_upstream")
    exec(compile(textwrap.dedent(source), "fake_upstream.py", "exec"), mod.__dict__)
    return mod


UPSTREAM = _module(
    """
    import json
    from json import loads as top_loads

    def body(x):
        from json import dumps, JSONDecoder as Decoder
        return dumps(x), top_loads("[1]"), Decoder.__name__, json.dumps(x)

    def nested(x):
        def inner():
            from json import dumps
            return dumps(x)
        return inner()
    """
)


def _tag(label):
    return lambda original: (lambda *a, **k: (label, original(*a, **k)))


def test_in_body_import_and_global_are_both_replaced():
    clone = rebind(UPSTREAM.body, {"dumps": _tag("import"), "top_loads": _tag("global")})
    dumped, loaded, decoder, module_attr = clone({"a": 1})
    assert dumped == ("import", json.dumps({"a": 1}))  # built from the original it replaces
    assert loaded == ("global", [1])
    assert decoder == "JSONDecoder"  # other names of the same import statement are untouched
    assert module_attr == json.dumps({"a": 1})  # attribute access on the module itself is untouched


def test_upstream_function_and_module_keep_their_names():
    rebind(UPSTREAM.body, {"dumps": _tag("import"), "top_loads": _tag("global")})
    assert UPSTREAM.body({"a": 1})[0] == json.dumps({"a": 1})
    assert UPSTREAM.top_loads is json.loads
    assert json.dumps is not None and json.dumps({"b": 2}) == '{"b": 2}'


def test_nested_code_sees_the_replacement_too():
    clone = rebind(UPSTREAM.nested, {"dumps": _tag("nested")})
    assert clone([1]) == ("nested", "[1]")
    assert "dumps" in imported_names(UPSTREAM.nested.__code__)


def test_required_name_missing_raises():
    with pytest.raises(RuntimeError, match=r"no longer reads \['fast_sample'\]"):
        rebind(UPSTREAM.body, {}, required=("fast_sample",))
    # Present as an import or as a global: both satisfy the requirement.
    rebind(UPSTREAM.body, {}, required=("dumps", "top_loads"))


def test_replacements_for_names_the_body_does_not_read_change_nothing():
    clone = rebind(UPSTREAM.body, {"not_there": _tag("x")})
    assert clone(3)[0] == "3"


# ---------------------------------------------------------------------------
# ReboundMethods: the declared (owner, method) -> names table; Site: what stand-ins learn about their call
# ---------------------------------------------------------------------------

OWNER = _module(
    """
    def helper(x):
        return ("upstream", x)

    class Worker:
        def step(self, x):
            return helper(x)

        def other(self, x):
            return x
    """
)


def test_rebound_methods_run_the_declared_stand_in_and_cache_the_body():
    table = ReboundMethods({(OWNER.Worker, "step"): ("helper",)}, stand_ins=lambda: {"helper": lambda x: ("detspec", x)})
    body = table(OWNER.Worker, "step")
    assert body(OWNER.Worker(), 1) == ("detspec", 1)
    assert body.__code__ is OWNER.Worker.step.__code__  # upstream's code object, not a copy
    assert table(OWNER.Worker, "step") is body
    assert OWNER.Worker().step(1) == ("upstream", 1)  # the class and its module are untouched
    table.cache_clear()
    assert table(OWNER.Worker, "step") is not body


def test_rebound_methods_refuse_a_body_that_no_longer_reads_a_declared_name():
    table = ReboundMethods(
        {(OWNER.Worker, "step"): ("helper",), (OWNER.Worker, "other"): ("helper",)},
        stand_ins=lambda: {"helper": lambda x: x},
    )
    with pytest.raises(RuntimeError, match=r"Worker.other no longer reads \['helper'\]"):
        table.build_all()


def test_site_is_visible_only_inside_and_restores_the_outer_one():
    site = Site("example")
    with pytest.raises(RuntimeError, match="stand_in was called outside a known example site"):
        site.require("stand_in")
    with site.entered("outer"):
        with site.entered("inner"):
            assert site.require("stand_in") == "inner"
        assert site.require("stand_in") == "outer"
    with pytest.raises(RuntimeError, match="outside a known example site"):
        site.require("stand_in")
