"""A fake ``sglang.launch_server`` for CPU tests of ``scripts/cross_card.py record``: a real process on ``--port``
that answers ``/health_generate`` and ``/generate`` (text + sampling_params with ``n``, ``return_logprob``) the way
SGLang shapes its answers, with tokens and logprobs that are a pure function of the prompt, the seed, the sample and
the algorithm -- what a deterministic server on one card gives.

``FAKE_CARD_NUDGE=ALGORITHM:SEED:POSITION`` moves that algorithm's logprob at that position, for requests with that
seed, by one float32 ulp when the request arrives while another is in flight: a card whose batched numbers differ.
``FAKE_CARD_TOKEN=ALGORITHM:SEED:POSITION`` changes that token in every answer: a card whose tokens differ.
"""

import json
import os
import signal
import struct
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _arg(flag, default=None):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else default


ALGORITHM = _arg("--speculative-algorithm", "NONE")
IN_FLIGHT = [0]
LOCK = threading.Lock()


def _target(var):
    text = os.environ.get(var)
    if not text:
        return None
    alg, seed, pos = text.split(":")
    return (alg, int(seed), int(pos)) if alg == ALGORITHM else None


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _next_f32(x):
    return struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", x))[0] + 1))[0]


def answer(text, params, sample, crowded):
    seed = params["sampling_seed"]
    base = zlib.crc32(f"{ALGORITHM}|{text}|{seed}|{sample}|{sorted(params.items())}".encode())
    ids, rows = [], []
    token, nudge = _target("FAKE_CARD_TOKEN"), _target("FAKE_CARD_NUDGE")
    for k in range(params["max_new_tokens"]):
        tid = (base + 31 * k) % 1000
        if token and token[1] == seed and token[2] == k:
            tid = (tid + 1) % 1000
        lp = _f32(-((base >> (k % 16)) % 997 + 1) / 97.0)
        if nudge and crowded and nudge[1] == seed and nudge[2] == k:
            lp = _next_f32(lp)
        ids.append(tid)
        rows.append([lp, tid, None])
    return {"text": "", "output_ids": ids,
            "meta_info": {"output_token_logprobs": rows, "completion_tokens": len(ids), "spec_verify_ct": 3}}


class Handler(BaseHTTPRequestHandler):
    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with LOCK:
            IN_FLIGHT[0] += 1
        time.sleep(0.02)  # let concurrent requests overlap
        with LOCK:
            crowded = IN_FLIGHT[0] > 1
        params = body["sampling_params"]
        out = [answer(body["text"], params, s, crowded) for s in range(params.get("n", 1))]
        with LOCK:
            IN_FLIGHT[0] -= 1
        self._send(out if params.get("n", 1) > 1 else out[0])

    def log_message(self, *a):
        pass


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # the default backlog of 5 resets connections that uvicorn's 2048 would queue
    daemon_threads = True


if __name__ == "__main__":
    server = Server(("127.0.0.1", int(_arg("--port"))), Handler)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print(f"fake launch_server {ALGORITHM} on {_arg('--port')}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
