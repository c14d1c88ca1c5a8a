"""The README's refusal table and the code's refusals (integration/setup/server_args.py) must agree: every flag or
environment variable a ``_refuse(...)`` call names appears in the README's table, and every flag in the table's
first column is one the code names. A refusal added without its README row (or a row left for a removed refusal)
fails here."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKEN = re.compile(r"--[a-z][a-z0-9-]+|SGLANG_[A-Z0-9_]+")


def _literal_parts(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def _strings_assigned(func: ast.AST, name: str):
    for node in ast.walk(func):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                yield from _literal_parts(node.value)


def refused_tokens() -> set:
    """Flags / env vars in the *flag* argument of every ``_refuse(name, flag, why, fix)`` call."""
    tree = ast.parse((ROOT / "sglang_detspec" / "integration" / "setup" / "server_args.py").read_text())
    tokens = set()
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            if getattr(call.func, "id", None) != "_refuse" or len(call.args) < 2:
                continue
            flag = call.args[1]
            parts = _literal_parts(flag) if not isinstance(flag, ast.Name) else list(_strings_assigned(func, flag.id))
            for part in parts:
                tokens |= set(TOKEN.findall(part))
    return tokens


def readme_table() -> list:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Flags it refuses at startup", 1)[1].split("\n### ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| flag")]


def test_every_refused_flag_has_a_readme_row():
    rows = "\n".join(readme_table())
    missing = sorted(t for t in refused_tokens() if t not in rows)
    assert not missing, f"refused in server_args.py but not in README's refusal table: {missing}"


def test_every_flag_in_the_readme_table_is_refused_by_the_code():
    # The refusing code reads a flag as its ServerArgs field (--rl-on-policy-target -> rl_on_policy_target) and the
    # prefill-alignment environment variables through compat's table.
    src = "".join((ROOT / "sglang_detspec" / "integration" / f).read_text() for f in ("setup/server_args.py", "compat.py"))
    first_column = " ".join(row.split("|")[1] for row in readme_table())
    unknown = sorted(t for t in set(TOKEN.findall(first_column))
                     if t not in src and t.lstrip("-").replace("-", "_") not in src)
    assert not unknown, f"README's refusal table names flags the code never mentions: {unknown}"


def test_the_scan_sees_the_refusals():
    # Guards the scan itself: a few refusals it must find (an AST change that hid them would pass the tests above).
    assert {"--speculative-eagle-topk", "--chunked-prefill-size", "--disaggregation-mode",
            "SGLANG_SIMULATE_ACC_LEN"} <= refused_tokens()
