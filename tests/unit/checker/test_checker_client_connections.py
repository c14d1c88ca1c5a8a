"""The checker's HTTP client against a server that drops a reused keep-alive connection unanswered.

SGLang's uvicorn closes an idle keep-alive connection after ``SGLANG_TIMEOUT_KEEP_ALIVE`` (5 s); a POST written
on it at that moment gets no answer. Here the server does that deterministically -- any second request on one
connection is dropped unanswered -- so a client that reuses connections for ``/generate`` fails the first test.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_detspec.checker.client import Client, ServerUnreachable
from sglang_detspec.command_base import CliError


class _DropsReusedConnections(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the client says close, as uvicorn
    drop_every_post = False

    def setup(self):
        super().setup()
        self.requests_on_this_connection = 0

    def do_POST(self):
        self.requests_on_this_connection += 1
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.drop_every_post or self.requests_on_this_connection > 1:
            self.close_connection = True  # the keep-alive timer fired: closed without a response
            return
        out = json.dumps({"text": "ok", "meta_info": {"echo": json.loads(body or b"{}")}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        if self.headers.get("Connection", "").lower() == "close":
            self.send_header("Connection", "close")  # uvicorn (h11) answers a client's close with close
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("Handler", (_DropsReusedConnections,), {})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_consecutive_generates_never_ride_a_connection_the_server_may_have_closed(server):
    _, url = server
    client = Client(url, timeout=10, pool_size=1)  # one pooled connection: any reuse would be visible
    try:
        for i in range(5):
            assert client.generate({"text": str(i)})[0]["meta_info"]["echo"] == {"text": str(i)}
    finally:
        client.close()


def test_a_generate_dropped_unanswered_is_an_error_naming_the_server_not_unreachable(server):
    handler, url = server
    handler.drop_every_post = True
    client = Client(url, timeout=10)
    try:
        with pytest.raises(CliError, match="closed the connection without answering") as err:
            client.generate({"text": "x"})
        assert not isinstance(err.value, ServerUnreachable)  # it reached the server; --wait must not poll on
        assert "/generate" in str(err.value) and "is the server running" not in str(err.value)
    finally:
        client.close()
