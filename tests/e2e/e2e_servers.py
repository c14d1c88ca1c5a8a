"""The E2E tests' SGLang server processes (:mod:`sglang_detspec.server_process`) with the E2E knobs from the
environment, and the pools that start them.

The session pool (tests/e2e/conftest.py) starts every configuration the selected tests name at once; a module that
serves a pair of its own (the reduced-vocabulary and token-map modules) makes a module-scoped pool with
:func:`module_pool`, on ports of its own. Standard library only at import time, like ``e2e_harness``.

Environment knobs (all optional):

* ``DETSPEC_E2E_BASE_PORT``     -- the session pool's first port (default 31000); module pools add their offset;
* ``DETSPEC_E2E_PARALLEL``      -- ``0`` starts servers one at a time instead of all at once;
* ``DETSPEC_E2E_START_TIMEOUT`` -- seconds to wait for one server (default 600);
* ``DETSPEC_E2E_EXTRA_ARGS``    -- extra ``launch_server`` arguments appended to every configuration.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Callable, Dict

from sglang_detspec import server_process
from sglang_detspec.server_process import ServerSpec

import e2e_harness


class Server(server_process.Server):
    """A server whose arguments end with DETSPEC_E2E_EXTRA_ARGS and whose process group is listed in
    ``server_pids.txt`` of the results directory."""

    log_prefix = "[detspec-e2e]"

    def __init__(self, spec: ServerSpec, port: int, log_path: Path):
        super().__init__(spec, port, log_path, extra_args=shlex.split(os.environ.get("DETSPEC_E2E_EXTRA_ARGS", "")),
                         pid_file=e2e_harness.out_dir() / "server_pids.txt")


class ServerPool(server_process.ServerPool):
    """Starts configurations on demand; the first request starts every name in ``prelaunch`` at once. Its ports start
    ``port_offset`` above ``DETSPEC_E2E_BASE_PORT``."""

    def __init__(self, specs: Dict[str, ServerSpec], port_offset: int = 0):
        super().__init__(
            specs, log_dir=e2e_harness.out_dir(), make_server=Server,
            # Several pools (the E2E tests, scripts/run_sglang_harness.py) may start servers on one machine at once.
            base_port=int(os.environ.get("DETSPEC_E2E_BASE_PORT", "31000")) + port_offset,
            parallel=os.environ.get("DETSPEC_E2E_PARALLEL", "1") != "0",
            timeout=float(os.environ.get("DETSPEC_E2E_START_TIMEOUT", "600")),
        )

    def ready(self, name: str) -> Server:
        """Server ``name``, serving; the test fails with its log's tail if it died instead."""
        import pytest

        srv = self.get(name)
        srv.wait_ready(self.timeout)
        if not srv.alive():
            pytest.fail(f"server {name} died; log tail:\n{srv.log_tail(80)}")
        return srv


def module_pool(make_specs: Callable[[], Dict[str, ServerSpec]], port_offset: int):
    """A module-scoped ``pool`` fixture: skipped where no E2E run is possible, else a :class:`ServerPool` of
    ``make_specs()`` that starts all of them at the first request and stops them after the module. ``port_offset``
    keeps it apart from the session pool's ports (31000+), lossless_check's (32000+) and the other module pools'
    (reduced vocabulary +3000, token map +5000). Use as ``pool = module_pool(_specs, port_offset=3000)``."""
    import pytest

    @pytest.fixture(scope="module")
    def pool():
        reason = e2e_harness.e2e_skip_reason()
        if reason:
            pytest.skip(reason)
        specs = make_specs()
        p = ServerPool(specs, port_offset)
        p.prelaunch = list(specs)
        yield p
        p.close()

    return pool
