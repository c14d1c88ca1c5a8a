"""A request whose seed no int64 holds is refused alone (HTTP 400), instead of crashing the scheduler.

Found on the H200 with sglang 0.5.17: ``sampling_seed = 2**64`` passed ``SamplingParams.verify`` and then raised
inside the scheduler while building the batch's int64 seed tensor, which took the server down. The test runs
SGLang's real plugin loader in a fresh interpreter and then SGLang's real ``SamplingParams.verify`` - the call
the tokenizer manager makes for every request - so it exercises the hook as a server applies it.
"""

import json
import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    r"""
    import json, os
    os.environ["SGLANG_PLUGINS"] = "detspec"
    import sglang.srt.plugins as plugins
    plugins.load_plugins()
    from sglang.srt.sampling.sampling_params import SamplingParams

    def outcome(**kw):
        try:
            SamplingParams(max_new_tokens=8, **kw).verify(1024)
        except ValueError as exc:
            return "ValueError: " + str(exc)
        return "ok"

    print(json.dumps({
        "too_big": outcome(sampling_seed=2**64),
        "too_small": outcome(sampling_seed=-(2**63) - 1),
        "not_int": outcome(sampling_seed=1.5),
        "max": outcome(sampling_seed=2**63 - 1),
        "min": outcome(sampling_seed=-(2**63)),
        "none": outcome(),
    }))
    """
)


def _run():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_out_of_range_and_non_integer_seeds_are_refused_in_range_seeds_pass():
    out = _run()
    assert out["too_big"] == f"ValueError: sampling_seed must be in [-2**63, 2**63 - 1], got {2**64}."
    assert out["too_small"] == f"ValueError: sampling_seed must be in [-2**63, 2**63 - 1], got {-(2**63) - 1}."
    assert out["not_int"].startswith("ValueError: sampling_seed must be an integer")
    assert out["max"] == "ok"
    assert out["min"] == "ok"
    assert out["none"] == "ok"
