"""SGLang's real HTTP server on CPU, with the scheduler replaced: for the request-validation and fuzz unit tests.

Run as a script (``python tests/unit/sglang_cpu_http_server.py [--no-validation]``) it loads the plugins with SGLang's
own loader, builds a real ``TokenizerManager`` for the embedded tiny (dummy) target (vocabulary 1,024, hidden size
256, context 16,384; ``--disable-radix-cache``, so ``input_embeds`` are accepted as on the E2E servers), and serves
SGLang's own FastAPI ``app`` (``/generate``, ``/v1/completions``, ``/v1/chat/completions`` with the built-in
``chatml`` template, its JSON / validation error handlers) with uvicorn on a loopback port, which it prints as
``PORT <n>``. Only the transport to the scheduler (``TokenizerManager._dispatch_to_scheduler``, a ZMQ socket) is
replaced by a stand-in that answers each request at once with one token.

The stand-in also records, at ``GET /_fake_scheduler``, every request that reached it carrying a value that the
real scheduler cannot survive (a token id outside the vocabulary, the measured H100 crash; and the values the
checks of :mod:`sglang_detspec.integration.setup.request_validation` refuse for that reason), so a test can tell "refused
at the door" from "let through to the scheduler". ``--no-validation`` removes the plugin's request checks the way
the E2E control does (``tests/e2e/controls/no_request_validation``).
"""

import argparse
import json
import math
import os
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def would_kill_the_scheduler(obj, vocab_size: int, hidden_size: int) -> list:
    """What in a tokenized request reaching the scheduler is out of the range it can index (empty: nothing)."""
    problems = []
    ids = list(obj.input_ids) if getattr(obj, "input_ids", None) is not None else []
    if any(not 0 <= t < vocab_size for t in ids):
        problems.append("input_ids outside the vocabulary")
    if getattr(obj, "input_embeds", None) is None and not ids:
        problems.append("empty prompt")
    embeds = getattr(obj, "input_embeds", None)
    if embeds is not None and any(len(r) != hidden_size or not all(math.isfinite(x) for x in r) for r in embeds):
        problems.append("input_embeds of the wrong width or not finite")
    sp = obj.sampling_params
    if any(not 0 <= t < vocab_size for t in (sp.stop_token_ids or ())):
        problems.append("stop_token_ids outside the vocabulary")
    if not isinstance(sp.top_k, int) or sp.top_k > (1 << 30):
        problems.append("top_k not an int32")
    if sp.logit_bias and any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in sp.logit_bias.values()):
        problems.append("logit_bias value not finite")
    if obj.return_logprob and not 0 <= obj.top_logprobs_num <= vocab_size:
        problems.append("top_logprobs_num outside [0, vocab]")
    if obj.logprob_start_len < -1:
        problems.append("logprob_start_len below -1")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-validation", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.no_validation:
        sys.path.insert(0, str(ROOT / "tests" / "e2e" / "controls" / "no_request_validation"))
        import sitecustomize  # noqa: F401 - the E2E control, applied before the plugin loads
    os.environ["SGLANG_PLUGINS"] = "detspec"
    import sglang.srt.plugins as plugins

    plugins.load_plugins()
    import uvicorn

    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.server_args import PortArgs, ServerArgs

    from sglang_detspec.models.tiny_models import ensure_tiny_models

    server_args = ServerArgs(model_path=str(ensure_tiny_models(pair="dummy").target), device="cpu",
                             disable_radix_cache=True)
    try:  # 0.5.23: a TokenizerManager refuses a config its process entry did not publish; 0.5.17 has no publish
        from sglang.srt.runtime_context import publish
    except ImportError:
        publish = None
    if publish is not None:
        publish(server_args, role="tokenizer")
    tm = TokenizerManager(server_args, PortArgs.init_new(server_args))
    vocab, hidden = tm.model_config.vocab_size, tm.model_config.hidden_size
    seen = {"requests": 0, "fatal": []}

    def scheduler_stand_in(obj):
        if hasattr(obj, "batch"):  # a BatchTokenizedGenerateReqInput
            for one in obj.batch:
                scheduler_stand_in(one)
            return
        if not hasattr(obj, "sampling_params") or not hasattr(obj, "input_ids"):
            return  # an abort or another control message
        seen["requests"] += 1
        problems = would_kill_the_scheduler(obj, vocab, hidden)
        if problems:
            seen["fatal"].append({"rid": obj.rid, "problems": problems})
        state = tm.rid_to_state.get(obj.rid)
        if state is not None:
            n_prompt = len(obj.input_ids) if obj.input_ids is not None else 0
            state.out_list.append({"text": "ok", "output_ids": [1], "meta_info": {
                "id": obj.rid, "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": n_prompt,
                "completion_tokens": 1, "cached_tokens": 0, "weight_version": "default"}})
            state.finished = True
            state.event.set()

    tm._dispatch_to_scheduler = scheduler_stand_in
    templates = TemplateManager()
    templates.initialize_templates(tm, server_args.model_path, chat_template="chatml")
    http_server.set_global_state(http_server._GlobalState(tokenizer_manager=tm, template_manager=templates,
                                                          scheduler_info={}))
    app = http_server.app
    app.state.openai_serving_completion = OpenAIServingCompletion(tm, templates)
    app.state.openai_serving_chat = tm.serving_chat_class(tm, templates)

    @app.get("/_fake_scheduler")
    def fake_scheduler_record():
        return {"requests": seen["requests"], "fatal": seen["fatal"], "vocab_size": vocab, "hidden_size": hidden,
                "context_len": tm.context_len}

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    print(f"PORT {port}", flush=True)
    sys.stdin.read()  # serve until the test closes our stdin
    server.should_exit = True
    thread.join(10)


class CpuServer:
    """Starts this script in a subprocess; ``base_url`` once it serves; :meth:`close` ends it."""

    def __init__(self, *, validation: bool = True, timeout: float = 300):
        import subprocess

        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)
        env.pop("SGLANG_PLUGINS", None)
        import tempfile

        cmd = [sys.executable, __file__] + ([] if validation else ["--no-validation"])
        # The server logs every refused request: a log file, not a pipe nobody drains (a full pipe blocks it).
        self.log = tempfile.NamedTemporaryFile("w+", prefix="sglang-cpu-server-", suffix=".log")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env, cwd=str(ROOT))
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("PORT ") or not line and self.proc.poll() is not None:
                break
        if not line.startswith("PORT "):
            self.close()
            self.log.seek(0)
            raise RuntimeError(f"the CPU SGLang server did not start:\n{self.log.read()[-4000:]}")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}"

    def record(self) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.base_url + "/_fake_scheduler", timeout=30) as r:
            return json.loads(r.read())

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(20)
            except Exception:  # noqa: BLE001 - fall through to kill
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


if __name__ == "__main__":
    main()
