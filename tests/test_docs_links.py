"""Every relative Markdown link of the README, the changelog and docs/*.md resolves: the file
exists inside the repository, and a `#anchor` names a heading of the page it points to."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+\1")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose_lines(path: Path, keep_code: bool = False) -> list[str]:
    """The page's lines outside fenced code blocks, inline code removed unless `keep_code`."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line if keep_code else INLINE_CODE.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces as '-'."""
    text = re.sub(r"`|\*\*|\*|__|\[|\]\([^)]*\)|\]", "", heading.strip()).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown page, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path, keep_code=True):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    return [match.group(1) for line in prose_lines(path) for match in LINK.finditer(line)]


def test_the_pages_exist():
    assert (ROOT / "README.md").is_file() and (ROOT / "docs" / "README.md").is_file()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        if "shared" in Path(unquote(file_part)).parts:
            broken.append(f"{target}: links to shared/, which is not part of the project")
            continue
        if file_part.startswith("/"):
            broken.append(f"{target}: absolute path")
            continue
        resolved = (page.parent / unquote(file_part)).resolve() if file_part else page
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor '#{anchor}' in {resolved.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_anchor_rule_matches_github():
    assert slug("The MoE layer's host floor") == "the-moe-layers-host-floor"
    assert slug("Profiling for a plan request (`--for-plan`)") == "profiling-for-a-plan-request---for-plan"
    assert (
        slug("(e) The sustained clock: `sustained_compute` (H100 SXM and H800 0.853, H200 0.88)")
        == "e-the-sustained-clock-sustained_compute-h100-sxm-and-h800-0853-h200-088"
    )


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md" and p.name not in index]
    assert not missing, f"docs/README.md does not list {missing}"
