"""``sglang-detspec check``: does a seeded probe give one output whatever the traffic around it?

* :mod:`.client`  -- ``--url`` validation, the HTTP client, server info, waiting for ``/health``;
* :mod:`.traffic` -- the traffic profiles (uniform, mixed, long, prefix; opt-in pressure): which fillers, when the
  probe goes;
* :mod:`.trials`  -- one trial on the wire: its requests in the order of its arrival, the answers as records;
* :mod:`.run`     -- running every profile's trials, comparing the probe's outputs, the first divergence;
* :mod:`.report`  -- the result dataclasses, the JSON report, the printed text.

It talks HTTP only (``requests``) and never imports SGLang, so it checks any SGLang server from anywhere.

Beside ``check``: :mod:`.cross_card` (``scripts/cross_card.py``: the same seeded requests recorded on one GPU and
compared bit for bit on another; it starts its own tiny-pair servers, as a subprocess) with its results file,
:mod:`.cross_card_results`.
"""

from sglang_detspec.checker.client import ServerInfo, ServerUnreachable, parse_server_url
from sglang_detspec.checker.report import EXIT_INCONCLUSIVE, CheckResult, format_check
from sglang_detspec.checker.run import (
    DEFAULT_MAX_FILLERS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PROMPT,
    DEFAULT_SEED,
    DEFAULT_TRIALS,
    run_check,
)
from sglang_detspec.checker.traffic import KNOWN_PROFILES, PROFILES, parse_traffic

__all__ = [
    "CheckResult", "ServerInfo", "ServerUnreachable", "format_check", "parse_server_url", "parse_traffic", "run_check",
    "PROFILES", "KNOWN_PROFILES", "EXIT_INCONCLUSIVE",
    "DEFAULT_MAX_FILLERS", "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_PROMPT", "DEFAULT_SEED", "DEFAULT_TRIALS",
]
