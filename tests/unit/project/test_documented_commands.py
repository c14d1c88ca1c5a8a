"""Every command the README and docs/ show for the project's own scripts and subcommands still parses: the script or
subcommand exists, ``--help`` exits 0, and every flag the documented command passes is one its ``--help`` lists.

A GPU command cannot run here, but a renamed or removed flag, a moved script or a subcommand that no longer imports
is what breaks a documented command most often, and that shows on CPU. The control is a documented command with a
flag its script does not have: the check must flag it.
"""

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# what starts one of the project's commands, and how to ask it for --help
_LAUNCHERS = [
    (re.compile(r"(?:python3?\s+)?((?:scripts|examples)/[\w/]+\.py)\b"), lambda m: [sys.executable, m.group(1)]),
    (re.compile(r"(?:bash\s+)?(scripts/[\w/]+\.sh)\b"), lambda m: ["bash", m.group(1)]),
    (re.compile(r"(?:python3?\s+-m\s+sglang_detspec|sglang-detspec)\s+([a-z][a-z-]+)\b"),
     lambda m: [sys.executable, "-m", "sglang_detspec", m.group(1)]),
]
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_END = re.compile(r"\s(?:#|\||>|&&|;)|`")
_SUBCOMMAND = re.compile(r"\s+([a-z][a-z_-]*)(?=\s|$)")
# sglang-detspec in prose ("sglang-detspec proposes ...") is not a command: only these subcommands exist
_SUBCOMMANDS = {"serve", "check", "demo", "bench", "bench-serve"}


def _command_lines(text: str):
    """Lines of code spans and indented blocks, backslash continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        for span in re.findall(r"`([^`]+)`", line) or [line]:
            yield span


def documented_commands(paths=DOCS):
    """``{(launcher...): {flag: [where, ...]}}`` for every project command in ``paths``."""
    found = {}
    for path in paths:
        for span in _command_lines(path.read_text()):
            for pattern, launcher in _LAUNCHERS:
                for m in pattern.finditer(span):
                    if pattern is _LAUNCHERS[2][0] and m.group(1) not in _SUBCOMMANDS:
                        continue
                    if not (ROOT / m.group(1)).exists() and pattern is not _LAUNCHERS[2][0]:
                        found.setdefault(("missing", m.group(1)), {})
                        continue
                    rest = span[m.end():]
                    end = _END.search(rest)
                    flags = _FLAG.findall(rest[: end.start()] if end else rest)
                    command = launcher(m)
                    sub = _SUBCOMMAND.match(rest)
                    if sub and pattern is _LAUNCHERS[0][0]:  # a script's subcommand (cross_card.py record ...)
                        command.append(sub.group(1))
                    entry = found.setdefault(tuple(command), {})
                    for flag in flags:
                        entry.setdefault(flag, []).append(path.name)
    return found


@functools.lru_cache(maxsize=None)
def _help(launcher: tuple) -> str:
    # the checkout's package, whichever one this Python has installed (scripts import the installed package)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([*launcher, "--help"], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"{' '.join(launcher)} --help exited {proc.returncode}: {proc.stderr[-1500:]}"
    return proc.stdout + proc.stderr


def unknown_flags(commands) -> list:
    problems = []
    for launcher, flags in sorted(commands.items()):
        if launcher[0] == "missing":
            problems.append(f"{launcher[1]}: documented but not in the repository")
            continue
        flags = {f: w for f, w in flags.items() if f != "--help"}
        if not flags:
            continue  # nothing to check beyond existence (and gpu_stage.sh, which is sourced, is never run)
        if launcher[0] == "bash" and "--help" not in (ROOT / launcher[1]).read_text():
            problems.append(f"{launcher[1]}: documented with flags {sorted(flags)} but reads no --help")
            continue
        text = _help(launcher)
        for flag, where in sorted(flags.items()):
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
                problems.append(f"{' '.join(launcher[1:])}: {flag} (in {', '.join(sorted(set(where)))}) is not in "
                                "its --help")
    return problems


def test_every_documented_command_parses():
    commands = documented_commands()
    assert len(commands) >= 10, sorted(commands)  # the scan sees the docs' commands
    problems = unknown_flags(commands)
    assert not problems, "\n".join(problems)


def test_control_a_documented_flag_the_script_lacks_is_caught(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("Run `python3 scripts/bench/bench_gemm.py --out DIR --no-such-flag` and\n"
                   "    python3 scripts/no_such_script.py --out DIR\n")
    problems = unknown_flags(documented_commands([doc]))
    assert any("--no-such-flag" in p for p in problems), problems
    assert any("scripts/no_such_script.py: documented but not in the repository" in p for p in problems), problems
    assert not any("--out" in p for p in problems), problems


@pytest.mark.parametrize("text,flags", [
    ("python3 scripts/bench/bench_gemm.py --out $OUT/g --quick | tail -3", {"--out", "--quick"}),
    ("python scripts/cross_card.py record --out h100.json --graphs on", {"--out", "--graphs"}),
    ("scripts/run_gpu_checks.sh OUT --only e2e \\\n    --e2e-tests tests/e2e/x.py  # a comment --ignored", {"--only", "--e2e-tests"}),
])
def test_the_scan_reads_flags_up_to_the_end_of_the_command(tmp_path, text, flags):
    doc = tmp_path / "doc.md"
    doc.write_text(text + "\n")
    ((launcher, entry),) = documented_commands([doc]).items()
    assert set(entry) == flags
    assert launcher[-1] == ("record" if "record" in text else launcher[-1])  # a script's subcommand is kept
