"""Fail when a page of the built docs site makes a request to another host by itself.

The site is read offline (``make docs``, then ``python3 -m http.server -d site``), so
nothing it loads may come from elsewhere: no script, stylesheet, font, image or frame,
no connection opened ahead (``preconnect``); a stylesheet's ``url()`` and ``@import``
neither. Links a reader follows (``<a href>``) are fine. The docs pass runs it on the
site it builds:

    python scripts/offline_site.py SITE_DIR
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

# What a browser fetches by itself: the attribute of each tag that names it.
FETCHED = {
    "script": "src",
    "img": "src",
    "iframe": "src",
    "source": "src",
    "video": "src",
    "audio": "src",
    "embed": "src",
    "object": "data",
}
# The kinds of <link> a browser fetches (or connects to) without a click.
FETCHED_LINKS = {
    "stylesheet",
    "preload",
    "modulepreload",
    "prefetch",
    "preconnect",
    "dns-prefetch",
    "icon",
    "apple-touch-icon",
    "manifest",
}
EXTERNAL = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)  # http://, https://, //
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""", re.IGNORECASE)


def is_external(url: str) -> bool:
    return bool(EXTERNAL.match(url))


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self.in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.in_style = tag == "style"
        values = {name: value or "" for name, value in attrs}
        if tag == "link":
            rels = set(values.get("rel", "").lower().split())
            url = values.get("href", "")
            if rels & FETCHED_LINKS and is_external(url):
                self.found.append(f"<link rel={values.get('rel')!r} href={url!r}>")
        elif tag in FETCHED and is_external(values.get(FETCHED[tag], "")):
            self.found.append(f"<{tag} {FETCHED[tag]}={values[FETCHED[tag]]!r}>")
        style = values.get("style", "")
        self.found += [f"<{tag} style> {url}" for url in css_urls(style) if is_external(url)]

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self.in_style = False

    def handle_data(self, data: str) -> None:
        if self.in_style:  # a <style> element's text: its url()s and @imports
            self.found += [f"<style> {url}" for url in css_urls(data) if is_external(url)]


def css_urls(text: str) -> list[str]:
    return [url or imported for url, imported in CSS_URL.findall(text)]


def external_requests(site: Path) -> list[str]:
    """Each request to another host the site's pages and stylesheets make, by file."""
    found = []
    for path in sorted(site.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text(errors="replace"))
        found += [f"{path.relative_to(site)}: {what}" for what in page.found]
    for path in sorted(site.rglob("*.css")):
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(site)}: {url}" for url in css_urls(text) if is_external(url)]
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    site = Path(argv[1])
    pages = len(list(site.rglob("*.html")))
    found = external_requests(site)
    for line in found:
        print(f"external request: {line}", file=sys.stderr)
    if found:
        print(
            f"{len(found)} requests to other hosts in {site}: serve them with the site "
            "(mkdocs.yml: theme font false, extra_javascript a local file).",
            file=sys.stderr,
        )
        return 1
    print(f"{pages} pages, no request to another host.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
