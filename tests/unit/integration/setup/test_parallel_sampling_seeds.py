"""``n > 1`` on a DETSPEC server: choice i of a seeded request is sent with ``choice_seed(seed, i)``.

The script below runs in a fresh interpreter: SGLang's real plugin loader applies the hook, a real
``TokenizerManager`` is built on CPU for the embedded tiny (dummy) target, and requests go through SGLang's real
``generate_request`` (``GenerateReqInput`` normalisation, ``_handle_batch_request``'s warm-up and ``n``-way
expansion, ``_tokenize_one_request``, ``_send_one_request``) and, for the OpenAI path, through the real
``OpenAIServingCompletion._convert_to_internal_request``. Only the inter-process transport
(``_dispatch_to_scheduler``, a ZMQ socket to the scheduler) is replaced on the instance by a recorder that answers
each request at once, with the seed it received as the output text, so the test also sees which output the user
gets for which seed. A DETSPEC server differs from a plain one only in its ``speculative_algorithm`` (written with
the release's own ServerArgs write path), so both run in the one process.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_detspec.stream.choice_seeds import choice_seed

pytest.importorskip("sglang")

_SCRIPT = textwrap.dedent(
    r"""
    import asyncio, copy, json, os
    os.environ["SGLANG_PLUGINS"] = "detspec"
    import sglang.srt.plugins as plugins
    plugins.load_plugins()
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.server_args import PortArgs, ServerArgs
    from sglang_detspec.integration import compat
    from sglang_detspec.integration.setup.parallel_sampling import SAME_SEED_ENV, parallel_sampling_hook_active
    from sglang_detspec.models.tiny_models import ensure_tiny_models

    plain_args = ServerArgs(model_path=str(ensure_tiny_models(pair="dummy").target), device="cpu")
    try:  # 0.5.23: a TokenizerManager refuses a config its process entry did not publish; 0.5.17 has no publish
        from sglang.srt.runtime_context import publish
    except ImportError:
        publish = None
    if publish is not None:
        publish(plain_args, role="tokenizer")
    tm = TokenizerManager(plain_args, PortArgs.init_new(plain_args))
    # A record of its own, not copy.copy(plain_args): on 0.5.19 the copy was not independent of the record the
    # TokenizerManager was built with -- the plain server derived seeds too (every time; 0.5.17/18/20-23 did not).
    detspec_args = ServerArgs(model_path=plain_args.model_path, device="cpu")
    compat.write_fields(detspec_args, "test.detspec_server", speculative_algorithm="DETSPEC_EAGLE")
    assert compat.read_field(plain_args, "speculative_algorithm") is None

    sent = []

    def scheduler_transport(obj):
        sp = obj.sampling_params
        sent.append({"seed": sp.sampling_seed, "max_new_tokens": sp.max_new_tokens, "prompt": list(obj.input_ids)})
        state = tm.rid_to_state.get(obj.rid)
        if state is not None:
            state.out_list.append({"text": json.dumps(sp.sampling_seed), "output_ids": [],
                                   "meta_info": {"id": obj.rid, "finish_reason": {"type": "length", "length": 0},
                                                 "prompt_tokens": len(obj.input_ids), "completion_tokens": 0,
                                                 "cached_tokens": 0}})
            state.finished = True
            state.event.set()

    tm._dispatch_to_scheduler = scheduler_transport
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    async def _collect(obj):
        outs = []
        async for out in tm.generate_request(obj):
            outs.extend(out if isinstance(out, list) else [out])
        return outs

    def generate(obj, detspec=True):
        tm.server_args = detspec_args if detspec else plain_args
        sent.clear()
        outs = loop.run_until_complete(_collect(obj))
        return {"sent": list(sent), "outputs": [json.loads(o["text"]) for o in outs]}

    def req(n, seed=None, prompts=([5, 6, 7],), **extra):
        sp = dict(n=n, max_new_tokens=4, **extra)
        if seed is not None:
            sp["sampling_seed"] = seed
        ids = list(prompts)
        return GenerateReqInput(input_ids=ids if len(ids) > 1 else ids[0], sampling_params=sp)

    out = {"hook_active": parallel_sampling_hook_active()}
    out["n4"] = generate(req(4, 1234))
    out["n1"] = generate(req(1, 1234))
    out["unseeded"] = generate(req(4))
    out["batch"] = generate(GenerateReqInput(
        input_ids=[[5, 6, 7], [8, 9]],
        sampling_params=[{"n": 3, "max_new_tokens": 4, "sampling_seed": 11},
                         {"n": 3, "max_new_tokens": 4, "sampling_seed": -7}]))
    out["request_opt_out"] = generate(req(4, 1234, custom_params={"detspec_same_seed_for_n": True}))
    out["not_detspec"] = generate(req(4, 1234), detspec=False)
    os.environ[SAME_SEED_ENV] = "1"
    out["env_opt_out"] = generate(req(4, 1234))
    del os.environ[SAME_SEED_ENV]

    serving = OpenAIServingCompletion(tm, TemplateManager())
    adapted, _ = serving._convert_to_internal_request(
        CompletionRequest(model="tiny", prompt=[5, 6, 7], n=4, seed=99, max_tokens=4))
    out["openai_completion"] = generate(adapted)
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def result():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.pop("SGLANG_DETSPEC_SAME_SEED_FOR_N", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _choices(run):
    """Seeds of the sends that generate tokens (not the max_new_tokens = 0 prefix warm-ups)."""
    return [s["seed"] for s in run["sent"] if s["max_new_tokens"] != 0]


def test_the_loader_applied_the_hook(result):
    assert result["hook_active"] is True


def test_n4_choices_get_the_request_seed_then_derived_seeds_in_output_order(result):
    expected = [1234, choice_seed(1234, 1), choice_seed(1234, 2), choice_seed(1234, 3)]
    assert _choices(result["n4"]) == expected
    assert result["n4"]["outputs"] == expected  # the i-th output the user gets is choice i
    assert len(set(expected)) == 4
    warmups = [s for s in result["n4"]["sent"] if s["max_new_tokens"] == 0]
    assert [w["seed"] for w in warmups] == [1234]


def test_a_batch_with_a_seed_per_prompt_derives_from_each_prompts_seed(result):
    expected = [choice_seed(11, i) for i in range(3)] + [choice_seed(-7, i) for i in range(3)]
    assert result["batch"]["outputs"] == expected
    prompts = [s["prompt"] for s in result["batch"]["sent"] if s["max_new_tokens"] != 0]
    assert prompts == [[5, 6, 7]] * 3 + [[8, 9]] * 3


def test_n1_and_unseeded_requests_are_unchanged(result):
    assert _choices(result["n1"]) == [1234] and result["n1"]["outputs"] == [1234]
    assert _choices(result["unseeded"]) == [None] * 4


@pytest.mark.parametrize("case", ["request_opt_out", "env_opt_out", "not_detspec"])
def test_opt_outs_and_other_servers_keep_one_seed_for_all_choices(result, case):
    assert _choices(result[case]) == [1234] * 4
    assert result[case]["outputs"] == [1234] * 4


def test_openai_completion_n_and_seed(result):
    expected = [choice_seed(99, i) for i in range(4)]
    assert _choices(result["openai_completion"]) == expected
    assert result["openai_completion"]["outputs"] == expected
