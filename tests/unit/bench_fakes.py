"""Fakes for bench-serve's orchestration tests (``tests/unit/bench/test_bench_serve*.py``): servers that record what
the runner asks of them, and the patches that put them, a fake pair and a no-op client process in place."""

import sys

__all__ = ["recording_server", "patch_bench_servers"]


def recording_server(events, fail_to_start=(), fail_first_start=()):
    """A ``server_process.Server`` stand-in class appending ``("start" | "ready" | "stop", name)`` to ``events``;
    servers named in ``fail_to_start`` (always) or ``fail_first_start`` (their first wait only) fail to start."""
    from sglang_detspec import server_process

    class FakeServer:
        def __init__(self, spec, port, log_path, pid_file=None):
            self.spec, self.name, self.port, self.log_path = spec, spec.name, port, log_path
            self.base_url, self.startup_s = f"http://127.0.0.1:{port}", 1.0

        def start(self):
            events.append(("start", self.name))

        def wait_ready(self, timeout):
            events.append(("ready", self.name))
            first = events.count(("ready", self.name)) == 1
            if self.name in fail_to_start or (first and self.name in fail_first_start):
                raise server_process.ServerStartError(f"server {self.name} exited with code 1 during start-up; log x")

        def stop(self):
            events.append(("stop", self.name))

    return FakeServer


def patch_bench_servers(monkeypatch, tmp_path, server_cls):
    """Serve every configuration with ``server_cls`` on a fake mid-size pair under ``tmp_path``; the runner's
    ``subprocess.Popen`` runs an empty Python instead of its command. Returns the runner module."""
    from sglang_detspec import server_process
    from sglang_detspec.bench.serving_bench import runner
    from sglang_detspec.models import midsize_models

    monkeypatch.setattr(server_process, "launch_skip_reason", lambda: None)
    monkeypatch.setattr(server_process, "Server", server_cls)
    monkeypatch.setattr(server_process, "sglang_version", lambda: "fake")
    monkeypatch.setattr(midsize_models, "ensure_midsize_pair",
                        lambda root, shape: midsize_models.MidsizePair(tmp_path / "t", tmp_path / "d"))
    real_popen = runner.subprocess.Popen
    monkeypatch.setattr(runner.subprocess, "Popen", lambda cmd, **kw: real_popen([sys.executable, "-c", "pass"], **kw))
    return runner
