"""Fixtures for the end-to-end tests (real SGLang servers on a tiny model pair, the weighted one by default).

A session-wide :class:`e2e_servers.ServerPool` starts, on first use, every server configuration named
by an ``e2e_server("<name>")`` marker on the selected tests, all at once, and stops them at the end
of the session. Tests ask for a ready server with ``e2e_pool.ready(name)``.
"""

import os
from pathlib import Path

import pytest

import e2e_harness
import e2e_servers
import family_harness


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e_server(name): the SGLang server configuration the test needs")
    config.addinivalue_line("markers", "slow: a long E2E variant, run only when its module's switch asks for it")


@pytest.fixture(scope="session")
def tiny_models():
    reason = e2e_harness.e2e_skip_reason()
    if reason:
        pytest.skip(reason)
    from sglang_detspec.models.tiny_models import ensure_tiny_models

    root = os.environ.get("DETSPEC_TINY_MODELS_ROOT")
    return ensure_tiny_models(Path(root) if root else None, pair=e2e_harness.tiny_pair())


@pytest.fixture(scope="session")
def e2e_pool(request, tiny_models):
    needed = []
    for item in request.session.items:
        for m in item.iter_markers("e2e_server"):
            if m.args[0] not in needed:
                needed.append(m.args[0])
    # The model-family servers (tests/e2e/test_e2e_families.py): only the pairs the selected tests name are built.
    root = os.environ.get("DETSPEC_TINY_MODELS_ROOT")
    pool = e2e_servers.ServerPool({**e2e_harness.server_specs(tiny_models),
                                   **family_harness.family_specs(Path(root) if root else None, needed)})
    pool.prelaunch = needed
    e2e_harness.record("_servers_planned", needed)
    yield pool
    startup = {n: s.startup_s for n, s in pool.servers.items()}
    pool.close()
    e2e_harness.record("_server_startup_s", startup)
