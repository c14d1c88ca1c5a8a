"""A release's pinned dependency closure, as this interpreter's environment sees it (CI helper).

    python ci/deps.py substitutions VERSION        the ci/substitutions.txt lines that apply to VERSION
    python ci/deps.py requirements  VERSION        sglang's requirements, substitutions applied (pip -r)
    python ci/deps.py check VERSION [--missing]    is the installed sglang's whole closure satisfied?

``check`` walks the installed ``sglang`` distribution's ``Requires-Dist`` recursively (markers evaluated for
this interpreter and for the extras each parent asks for), resolving every name the way Python imports it:
the first distribution on ``sys.path``, so an overlay directory on ``PYTHONPATH`` shadows the base venv. It
prints one line per unmet requirement and exits 1 if there is any; ``--missing`` prints just the requirement
strings to install (one per line) and exits 0. A requirement listed in ci/substitutions.txt for VERSION is
checked (and installed) as its replacement.
"""

from __future__ import annotations

import pathlib
import sys
from importlib import metadata

SUBSTITUTIONS = pathlib.Path(__file__).with_name("substitutions.txt")


def _release(text: str) -> tuple:
    return tuple(int(part) for part in text.split("."))


def substitutions(version: str) -> dict:
    """{pinned requirement: (installed instead, raw line)} for ``version``. Needs no third-party package: the
    venv scripts call it with the system python to key their caches."""
    out = {}
    for line in SUBSTITUTIONS.read_text().splitlines():
        fields = line.split("--", 1)[0].split()
        if not fields or line.lstrip().startswith("#"):
            continue
        first, last, pinned, instead = fields
        if _release(first) <= _release(version) <= _release(last):
            out[pinned] = (instead, line)
    return out


def _first_distributions() -> dict:
    """canonical name -> the distribution Python would see first on sys.path."""
    from packaging.utils import canonicalize_name

    seen = {}
    for dist in metadata.distributions():  # in sys.path order
        name = dist.metadata["Name"]
        if name:
            seen.setdefault(canonicalize_name(name), dist)
    return seen


def _applies(req, env: dict, extras: frozenset) -> bool:
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def requirements(version: str) -> list:
    """The installed sglang's own requirements for this interpreter, substitutions applied."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    subs = substitutions(version)
    env = default_environment()
    out = []
    for text in metadata.requires("sglang") or ():
        req = Requirement(text)
        if _applies(req, env, frozenset()):
            shown = str(req).split(";")[0].strip()
            shown = subs[shown][0] if shown in subs else shown
            if req.name == "torch" and str(req.specifier).startswith("=="):
                # The PyPI build itself: a find-links directory's local variant (2.13.0+cpu) also matches
                # ==2.13.0, and PyPI's torchvision wheels fail to register their ops against it.
                shown = "torch===" + str(req.specifier)[2:]
            out.append(shown)
    return out


def unmet(version: str) -> list:
    """(requirement to install, wanted by, found version or None) for every unmet requirement in the closure."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    subs = substitutions(version)
    installed = _first_distributions()
    env = default_environment()
    problems = set()
    todo, done = [("sglang", frozenset())], set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        dist = installed.get(name)
        if dist is None:
            problems.add((name, "the command line", None))
            continue
        for text in dist.requires or ():
            req = Requirement(text)
            if not _applies(req, env, extras):
                continue
            pinned = str(req).split(";")[0].strip()
            if pinned in subs:
                req = Requirement(subs[pinned][0])
            key = canonicalize_name(req.name)
            found = installed.get(key)
            if found is None or not req.specifier.contains(found.version, prereleases=True):
                wanted = str(req).split(";")[0].strip()
                problems.add((wanted, f"{dist.metadata['Name']} {dist.version}", None if found is None else found.version))
                continue
            todo.append((key, frozenset(req.extras)))
    return sorted(problems, key=lambda p: (p[0], p[1]))


def main(argv: list) -> int:
    if len(argv) < 2 or argv[0] not in ("substitutions", "requirements", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    command, version = argv[0], argv[1]
    if command == "substitutions":
        for _, line in substitutions(version).values():
            print(line)
        return 0
    if command == "requirements":
        print("\n".join(requirements(version)))
        return 0
    problems = unmet(version)
    if "--missing" in argv[2:]:
        for requirement in sorted({p[0] for p in problems}):
            print(requirement)
        return 0
    for requirement, wanted_by, found in problems:
        print(f"{requirement} wanted by {wanted_by}, found {found or 'nothing'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
