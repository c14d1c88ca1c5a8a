"""A real ``python -m sglang.launch_server`` process: start it with its output in a log file, wait until it serves,
stop it and its children; plus the few JSON-over-HTTP helpers its callers use.

Shared by ``sglang-detspec bench-serve`` (:mod:`sglang_detspec.bench.serving_bench`), the end-to-end tests
(``tests/e2e/e2e_harness.py``) and the GPU scripts (``scripts/lossless_check.py``, ``scripts/run_sglang_harness.py``),
so that none of them imports another's files. Standard library only: importing it costs nothing, and the callers'
``--help`` and CPU tests never touch torch or SGLang.

A server that exits during start-up, or is not serving after ``timeout`` seconds, raises :class:`ServerStartError`
with the tail of its log: a caller never waits forever on a server that will not come up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

__all__ = [
    "ServerSpec",
    "Server",
    "ServerPool",
    "ServerStartError",
    "HTTPStatusError",
    "free_port",
    "post_json",
    "get_json",
    "sglang_version",
    "version_tuple",
    "launch_skip_reason",
]

RUN_HINT = "run scripts/run_gpu_checks.sh on a CUDA machine with sglang installed"
GPU_SKIP_REASON = "needs a CUDA GPU; run scripts/run_gpu_checks.sh on a GPU machine"


def launch_skip_reason() -> Optional[str]:
    """Why no SGLang server can be launched here, or None. Never imports SGLang (its import is slow and pulls CUDA
    extensions); only checks that it is installed and that torch sees a CUDA GPU."""
    if importlib.util.find_spec("sglang") is None:
        return f"needs sglang installed; {RUN_HINT}"
    try:
        import torch
    except ImportError:
        return f"needs torch; {RUN_HINT}"
    if not torch.cuda.is_available():
        return GPU_SKIP_REASON
    return None


def sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        import sglang  # a source checkout on PYTHONPATH has no dist-info

        return getattr(sglang, "__version__", "unknown")


def version_tuple(v: str) -> tuple:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


@dataclass
class ServerSpec:
    """One server configuration: its name, its ``launch_server`` arguments (without ``--port``), its environment."""

    name: str
    args: List[str]
    expect_exit: bool = False  # True: the configuration is expected to be refused at start-up
    env: Dict[str, str] = field(default_factory=dict)


def free_port(start: int, span: int = 2) -> int:
    """First port >= start such that it and the ``span - 1`` ports after it are free on 127.0.0.1 (a server
    listens on its port and rendezvouses NCCL on the next one, see :meth:`Server.command`), stepping by 50."""
    port = start
    while True:
        if all(_bindable(p) for p in range(port, port + span)):
            return port
        port += 50


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class ServerStartError(RuntimeError):
    """The server exited during start-up or did not serve in time; the message carries its log's tail."""


class Server:
    """One ``launch_server`` process in its own session (so :meth:`stop` ends it and its children, nothing else).

    ``extra_args`` go after the spec's arguments (SGLang's parser keeps the last occurrence of a flag);
    ``pid_file``, when given, gets the process-group id appended, so a wrapper killed by a time limit can still
    end exactly these servers (``kill -- -PID``).
    """

    log_prefix = "[sglang-detspec]"

    def __init__(self, spec: ServerSpec, port: int, log_path: Path, *, extra_args: Sequence[str] = (),
                 pid_file: Optional[Path] = None):
        self.spec = spec
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = Path(log_path)
        self.extra_args = list(extra_args)
        self.pid_file = pid_file
        self.proc: Optional[subprocess.Popen] = None
        self.ready = False
        self.startup_s: Optional[float] = None
        self._t0 = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    def command(self) -> List[str]:
        # An explicit --nccl-port: without one SGLang asks the OS for a free port and binds it later, and servers
        # starting side by side then race for it (an H200 bench-serve run lost its DETSPEC server to EADDRINUSE).
        return [sys.executable, "-m", "sglang.launch_server", *self.spec.args, "--port", str(self.port),
                "--nccl-port", str(self.port + 1), *self.extra_args]

    def start(self) -> None:
        env = dict(os.environ)
        # An accidental hub lookup must fail fast instead of hanging on a machine without network.
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.pop("TRITON_INTERPRET", None)  # the server must compile real kernels
        env.update(self.spec.env)
        cmd = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w", buffering=1)
        log.write("$ " + shlex.join(cmd) + "\n")
        self._t0 = time.time()
        # A new session makes the server and its scheduler/detokenizer children one process group.
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        if self.pid_file is not None:
            with open(self.pid_file, "a") as f:
                f.write(f"{self.proc.pid}\n")
        print(f"{self.log_prefix} started {self.name} pid={self.proc.pid} port={self.port} log={self.log_path}",
              flush=True)

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float) -> None:
        """Until ``/health_generate`` answers 200 (SGLang's own warm-up has run); raises :class:`ServerStartError`
        when the process exits first or ``timeout`` seconds after :meth:`start` have passed."""
        if self.ready:
            return
        if self.proc is None:
            raise ServerStartError(f"server {self.name} was never started")
        deadline = self._t0 + timeout
        while time.time() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerStartError(
                    f"server {self.name} exited with code {rc} during start-up; log {self.log_path}:\n{self.log_tail(80)}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health_generate", timeout=10) as r:
                    if r.status == 200:
                        self.ready = True
                        self.startup_s = round(time.time() - self._t0, 1)
                        print(f"{self.log_prefix} {self.name} ready after {self.startup_s} s", flush=True)
                        return
            except (urllib.error.URLError, ConnectionError, socket.timeout, OSError):
                pass
            time.sleep(2)
        raise ServerStartError(f"server {self.name} not ready after {timeout} s; log {self.log_path}:\n{self.log_tail(80)}")

    def wait_exit(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout=max(0.0, self._t0 + timeout - time.time()))
        except subprocess.TimeoutExpired:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGTERM to the launcher alone lets SGLang shut its children down in order; the group
            # kill below only mops up whatever did not exit.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class ServerPool:
    """Starts configurations on demand, each on its own port from ``base_port`` on; with ``parallel``, the first
    request starts every name in ``prelaunch`` at once (start-up is mostly CPU-side compilation and graph capture,
    which overlap well). ``make_server(spec, port, log_path)`` builds each :class:`Server`."""

    def __init__(self, specs: Dict[str, ServerSpec], *, log_dir: Path, base_port: int = 31000, parallel: bool = True,
                 timeout: float = 600.0, make_server: Callable[[ServerSpec, int, Path], Server] = Server):
        self.specs = specs
        self.servers: Dict[str, Server] = {}
        self.prelaunch: List[str] = []
        self.log_dir = Path(log_dir)
        # Several pools may start servers on one machine at once: each needs its own range, as free_port only sees
        # ports that are already bound.
        self._next_port = base_port
        self.parallel = parallel
        self.timeout = timeout
        self.make_server = make_server

    def _start(self, name: str) -> Server:
        port = free_port(self._next_port)
        self._next_port = port + 200
        srv = self.make_server(self.specs[name], port, self.log_dir / f"server-{name}.log")
        srv.start()
        self.servers[name] = srv
        return srv

    def get(self, name: str) -> Server:
        if name not in self.servers:
            if self.parallel:
                for other in self.prelaunch:
                    if other not in self.servers:
                        self._start(other)
            if name not in self.servers:
                self._start(name)
        return self.servers[name]

    def release(self, name: str) -> None:
        srv = self.servers.get(name)
        if srv is not None:
            srv.stop()

    def close(self) -> None:
        for srv in self.servers.values():
            srv.stop()


class HTTPStatusError(RuntimeError):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


def post_json(base_url: str, path: str, payload: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(
        base_url + path, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        raise HTTPStatusError(e.code, e.read().decode(errors="replace")) from None


def get_json(base_url: str, path: str, timeout: float = 60) -> dict:
    with urllib.request.urlopen(base_url + path, timeout=timeout) as r:
        return json.loads(r.read().decode())
