"""Every relative link in README.md and docs/*.md resolves: the file exists, and a ``#anchor`` into a Markdown file
names one of its headings as GitHub slugs it. The README's numbers link into docs/results.md by anchor, so a
renamed heading or a moved file fails here instead of leaving a reader at a dead link."""

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and ![alt](target), the target up to the first space or ')' (an optional "title" may follow).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str, blank_code: bool = True):
    """The lines outside fenced and indented code blocks, with inline code spans blanked (links there are code)
    unless ``blank_code`` is False (headings: GitHub slugs the code's text too)."""
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            in_fence = not in_fence
            continue
        if in_fence or line.startswith("    ") or line.startswith("\t"):
            continue
        yield re.sub(r"`[^`]*`", lambda m: " " * len(m.group()), line) if blank_code else line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: the rendered text lower-cased, every character that is not a letter, a
    mark, a digit, an underscore, a hyphen or a space dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").replace("*", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set:
    """Every heading anchor of ``page``; repeated slugs get -1, -2, ... as on GitHub."""
    seen: dict = {}
    out = set()
    for line in _prose_lines(page.read_text(encoding="utf-8"), blank_code=False):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(page: Path):
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
                continue
            yield target


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(page: Path) -> list:
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        dest = page if not path_part else (page.parent / unquote(path_part)).resolve()
        if not dest.exists():
            broken.append(f"{target} (no such file {_shown(dest)})")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {_shown(dest)})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    assert not broken_links(page), f"{_shown(page)}: broken links: {broken_links(page)}"


def test_the_pages_link_to_each_other():
    # Guards the scan itself: links it must see (a regex that found nothing would pass the test above).
    readme_links = set(relative_links(ROOT / "README.md"))
    assert "docs/results.md" in readme_links and "docs/gpu.md" in readme_links
    assert any(t.startswith("docs/results.md#") for t in readme_links)
    assert any("#" in t for p in PAGES[1:] for t in relative_links(p))


@pytest.mark.parametrize("heading, slug", [
    ("What makes a request's tokens its own", "what-makes-a-requests-tokens-its-own"),
    ("Parallel samples (`n > 1`)", "parallel-samples-n--1"),
    ("2026-12-05, H100, commit 7bcbc44: coupled-race kernels", "2026-12-05-h100-commit-7bcbc44-coupled-race-kernels"),
    ("check --against on fresh servers", "check---against-on-fresh-servers"),
    ("Lossless: the output distribution is the target's", "lossless-the-output-distribution-is-the-targets"),
    ("DETSPEC_EAGLE against a non-speculative server", "detspec_eagle-against-a-non-speculative-server"),
    ("Staging — on a GPU", "staging--on-a-gpu"),
])
def test_slugs_follow_github(heading, slug):
    assert github_slug(heading) == slug


def test_a_heading_with_inline_code_keeps_the_codes_text_in_its_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Parallel samples (`n > 1`)\n\n## `--flag` and more\n")
    assert anchors(page) == {"page", "parallel-samples-n--1", "--flag-and-more"}


def test_a_broken_link_and_a_missing_anchor_are_reported(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n", encoding="utf-8")
    page.write_text("# Page\n\n[ok](other.md#a-section) [gone](missing.md) [bad anchor](other.md#no-such) "
                    "[self](#page) [self bad](#nope) [web](https://example.com/x.md)\n\n"
                    "    [in code](also-missing.md)\n", encoding="utf-8")
    found = broken_links(page)
    assert len(found) == 3, found
    assert any(b.startswith("missing.md") for b in found)
    assert any(b.startswith("other.md#no-such") for b in found)
    assert any(b.startswith("#nope") for b in found)
