"""The one reader of the plugin's on/off environment variables (integration/setup/env_switch.py): ``1`` on, ``0`` off,
empty / unset the switch's default, anything else the caller's refusal from the one table, naming the variable and
the accepted values."""

import pytest

from sglang_detspec.integration.setup import attention_index_cache as aic
from sglang_detspec.integration.setup import batch_invariant_ops as bio
from sglang_detspec.integration.setup.env_switch import env_switch
from sglang_detspec.integration.setup.refusals import DetspecConfigError

# The switches read through it, with their refusal rows; the names written out (they are user-facing).
SWITCHES = [
    ("SGLANG_DETSPEC_FAST_INVARIANT_DRAFT", "fast_invariant_draft"),
    ("SGLANG_DETSPEC_ATTN_INDEX_CACHE", "attn_index_cache"),
    ("SGLANG_DETSPEC_GEMM_SPLIT_K", "gemm_split_k"),
]
# How each switch's refusal names its unset state: off, or on by default.
UNSET_WORDS = {"fast_invariant_draft": "'0' / unset", "attn_index_cache": "'1' / unset", "gemm_split_k": "'1' / unset"}


@pytest.mark.parametrize("variable, key", SWITCHES)
@pytest.mark.parametrize("default", [False, True])
@pytest.mark.parametrize("value, expected", [(None, None), ("", None), ("0", False), ("1", True)])
def test_allowed_values(variable, key, value, expected, default):
    environ = {} if value is None else {variable: value}
    assert env_switch(variable, key, environ, default=default) is (default if expected is None else expected)


@pytest.mark.parametrize("variable, key", SWITCHES)
@pytest.mark.parametrize("value", ["true", "on", "yes", "2", "01", " 1", "1 ", "-1", "off"])
def test_any_other_value_is_the_callers_refusal(variable, key, value):
    with pytest.raises(DetspecConfigError) as info:
        env_switch(variable, key, {variable: value})
    message = str(info.value)
    assert message.startswith(f"{variable}={value!r} is not an allowed value: ")
    assert "'1'" in message and "'0'" in message and UNSET_WORDS[key] in message


def test_another_variable_is_not_read():
    assert env_switch("SGLANG_DETSPEC_ATTN_INDEX_CACHE", "attn_index_cache",
                      {"SGLANG_DETSPEC_FAST_INVARIANT_DRAFT": "1"}) is False


def test_the_process_environment_is_read_by_default(monkeypatch):
    variable, key = SWITCHES[0]
    monkeypatch.setenv(variable, "1")
    assert env_switch(variable, key) is True
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(DetspecConfigError, match=variable):
        env_switch(variable, key)
    monkeypatch.delenv(variable)
    assert env_switch(variable, key) is False


# Each switch's reader, with the variable it reads and its default: the readers the plugin calls pass the right
# variable, refusal row and default to env_switch.
READERS = [
    (bio.fast_draft_wanted, "SGLANG_DETSPEC_FAST_INVARIANT_DRAFT", False),
    (aic.attention_index_cache_wanted, "SGLANG_DETSPEC_ATTN_INDEX_CACHE", True),
    (bio.gemm_split_k_wanted, "SGLANG_DETSPEC_GEMM_SPLIT_K", True),
]


@pytest.mark.parametrize("reader, variable, default", READERS, ids=lambda x: getattr(x, "__name__", None))
@pytest.mark.parametrize("value", [None, "", "0", "1"])
def test_each_reader_reads_its_variable_with_its_default(reader, variable, default, value):
    environ = {} if value is None else {variable: value}
    assert reader(environ) is ({"0": False, "1": True}.get(value, default))


@pytest.mark.parametrize("reader, variable, default", READERS, ids=lambda x: getattr(x, "__name__", None))
@pytest.mark.parametrize("bad", ["true", "on", "2", " 1"])
def test_each_reader_refuses_anything_else_naming_its_variable(reader, variable, default, bad):
    with pytest.raises(ValueError, match=f"{variable}={bad!r} is not an allowed value.*'1'"):
        reader({variable: bad})
