"""The launcher's ports: each server gets its HTTP port and, explicitly, its NCCL rendezvous port (the next one).

Without ``--nccl-port`` SGLang takes a port the OS reports free and binds it only later, so servers started side by
side race for it: on the H200 a bench-serve run with five servers starting together lost its DETSPEC server to
``EADDRINUSE`` in ``init_process_group``.
"""

import argparse
import socket

import pytest

from sglang_detspec import server_process
from sglang_detspec.server_process import Server, ServerSpec, free_port


def test_every_server_gets_its_own_nccl_port_next_to_its_http_port(tmp_path):
    srv = Server(ServerSpec("s", ["--model-path", "/m"]), 33200, tmp_path / "s.log", extra_args=["--log-level", "debug"])
    cmd = srv.command()
    assert cmd[cmd.index("--port") + 1] == "33200"
    assert cmd[cmd.index("--nccl-port") + 1] == "33201"
    assert cmd[-2:] == ["--log-level", "debug"], "extra arguments stay last, so they can still override"


def test_a_pool_gives_side_by_side_servers_disjoint_ports(tmp_path):
    started = []

    class Recorder(Server):
        def start(self):
            started.append(self.command())

    specs = {n: ServerSpec(n, []) for n in ("a", "b", "c")}
    pool = server_process.ServerPool(specs, log_dir=tmp_path, base_port=34000, make_server=Recorder)
    pool.prelaunch = list(specs)
    pool.get("a")
    ports = [int(c[c.index(flag) + 1]) for c in started for flag in ("--port", "--nccl-port")]
    assert len(started) == 3 and len(set(ports)) == 6


def test_free_port_skips_a_port_whose_nccl_neighbour_is_taken():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
    if base > 65000:
        pytest.skip("the OS handed out a port too close to the top of the range")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        try:
            taken.bind(("127.0.0.1", base + 1))
        except OSError:
            pytest.skip("the neighbouring port is already in use on this machine")
        assert free_port(base) != base
        assert free_port(base, span=1) == base  # only the HTTP port matters with span 1


def test_sglang_parses_the_nccl_port_flag():
    server_args = pytest.importorskip("sglang.srt.server_args", reason="SGLang is not installed")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "/m", "--port", "33200", "--nccl-port", "33201"])
    assert ns.nccl_port == 33201
