"""The README's refusal table and the code's refusals (integration/setup/refusals.py, the one table the
server-argument hook raises from) must agree: every flag or environment variable a refusal's *flag* names appears
in the README's table, and every flag in the table's first column is one the code names. A refusal added without
its README row (or a row left for a removed refusal) fails here."""

import re
from pathlib import Path

from sglang_detspec.integration.setup.refusals import REFUSALS

ROOT = Path(__file__).resolve().parents[4]
TOKEN = re.compile(r"--[a-z][a-z0-9-]+|SGLANG_[A-Z0-9_]+")


def refused_tokens() -> set:
    """Flags / env vars in the *flag* template of every refusal (placeholders name no flag)."""
    tokens = set()
    for refusal in REFUSALS.values():
        tokens |= set(TOKEN.findall(refusal.flag))
    return tokens


def readme_table() -> list:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Flags it refuses at startup", 1)[1].split("\n### ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| flag")]


def test_every_refused_flag_has_a_readme_row():
    rows = "\n".join(readme_table())
    missing = sorted(t for t in refused_tokens() if t not in rows)
    assert not missing, f"refused in refusals.py but not in README's refusal table: {missing}"


def test_every_flag_in_the_readme_table_is_refused_by_the_code():
    # The refusing code reads a flag as its ServerArgs field (--rl-on-policy-target -> rl_on_policy_target) and the
    # prefill-alignment environment variables through compat's table.
    src = "".join((ROOT / "sglang_detspec" / "integration" / f).read_text()
                  for f in ("setup/refusals.py", "setup/server_args.py", "compat.py"))
    first_column = " ".join(row.split("|")[1] for row in readme_table())
    unknown = sorted(t for t in set(TOKEN.findall(first_column))
                     if t not in src and t.lstrip("-").replace("-", "_") not in src)
    assert not unknown, f"README's refusal table names flags the code never mentions: {unknown}"


def test_the_scan_sees_the_refusals():
    # Guards the scan itself: a few refusals it must find (a change of the table's form that hid them would pass the
    # tests above).
    assert {"--speculative-eagle-topk", "--chunked-prefill-size", "--disaggregation-mode",
            "SGLANG_SIMULATE_ACC_LEN"} <= refused_tokens()
