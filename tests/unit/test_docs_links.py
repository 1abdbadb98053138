"""Every internal link of README.md and docs/*.md leads to a file, and to a heading there.

``mkdocs build --strict`` checks the links of docs/ but not their anchors, and never sees
README.md, the page most readers start from (on GitHub and PyPI).
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Fenced blocks and inline code hold examples, not links: left out before the search.
FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1`*\s*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+).+?\1", re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
ATTR_ID = re.compile(r"\{[^}]*#([\w-]+)[^}]*\}\s*$")
HTML_ID = re.compile(r"""\b(?:id|name)=["']([^"']+)["']""")


def _prose(text: str) -> str:
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading (MkDocs' default)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


@cache
def anchors(page: Path) -> frozenset[str]:
    text = FENCE.sub("", page.read_text())
    found = set(HTML_ID.findall(text))
    for heading in HEADING.findall(text):
        custom = ATTR_ID.search(heading)
        found.add(custom.group(1) if custom else slug(heading))
    return frozenset(found)


def links() -> list[tuple[Path, str]]:
    found = []
    for page in PAGES:
        for target in LINK.findall(_prose(page.read_text())):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...: not ours
                found.append((page, target))
    return found


def test_the_pages_have_links_to_check():
    assert len(links()) > 100  # the search above finds them at all


@pytest.mark.parametrize(
    ("page", "target"), links(), ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in links()]
)
def test_an_internal_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    destination = (page.parent / path).resolve() if path else page
    assert destination.exists(), f"{page.relative_to(ROOT)} links to {path}, which is missing"
    if anchor and destination.suffix == ".md":
        assert anchor in anchors(destination), (
            f"{page.relative_to(ROOT)} links to #{anchor}, which is no heading of "
            f"{destination.relative_to(ROOT)}"
        )


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The `idempotency` logger", "the-idempotency-logger"),
        ("Your API's own error shape", "your-apis-own-error-shape"),
        (
            "1. Observe: protect keyed requests, count the others",
            "1-observe-protect-keyed-requests-count-the-others",
        ),
    ],
)
def test_slugs_are_those_of_the_site(heading, anchor):
    assert slug(heading) == anchor


def test_the_diagrams_renderer_is_served_with_the_site():
    # Material for MkDocs fetches Mermaid from a CDN unless a page has loaded it already:
    # the site loads its own copy first, so an offline reader still sees the diagrams.
    config = (ROOT / "mkdocs.yml").read_text()
    scripts = re.search(r"^extra_javascript:\n((?:  - .+\n)+)", config, re.MULTILINE)
    assert scripts, "mkdocs.yml lists no extra_javascript"
    listed = re.findall(r"  - (\S+)", scripts.group(1))
    assert "js/mermaid.min.js" in listed
    assert not [script for script in listed if re.match(r"(https?:)?//", script)]
    renderer = (ROOT / "docs" / "js" / "mermaid.min.js").read_bytes()
    assert renderer.rstrip().endswith(
        b'globalThis["mermaid"] = globalThis.__esbuild_esm_mermaid_nm["mermaid"].default;'
    )
    assert b"```mermaid" in b"".join(page.read_bytes() for page in PAGES)  # still needed


def test_no_diagram_line_is_cut_by_a_semicolon():
    # Mermaid ends a statement at ";": "V->>DB: BEGIN; claim" is a parse error, and the
    # reader sees an error box where the diagram was.
    blocks = [
        block
        for page in PAGES
        for block in re.findall(r"^```mermaid\n(.*?)^```", page.read_text(), re.DOTALL | re.M)
    ]
    assert blocks
    assert [line for block in blocks for line in block.splitlines() if ";" in line] == []
