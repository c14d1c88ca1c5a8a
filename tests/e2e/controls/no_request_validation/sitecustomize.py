"""E2E control only (never installed, never on a user's path): the plugin without its request checks.

Put on PYTHONPATH by ``tests/e2e/test_e2e_fuzz.py`` for its ``detspec_no_validation`` server alone (and by
``tests/unit/sglang_cpu_http_server.py --no-validation``). Python runs ``sitecustomize`` at start-up in every process
of that server; this one makes :func:`sglang_detspec.integration.setup.request_validation.install_request_validation`
register nothing, so SGLang sees every request as upstream does (the plugin's other hooks are unchanged; the
plugin looks the function up when it loads, after this file ran). ``tests/e2e/test_e2e_fuzz.py`` expects the same
fuzz to lose this server (it dies, or answers 5xx): it shows that the fuzz can see what the checks prevent.
"""

from sglang_detspec.integration.setup import request_validation


def _install_nothing() -> list:
    return []


request_validation.install_request_validation = _install_nothing
