"""scripts/offline_site.py, which the docs pass runs on the site it builds: no request leaves it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.processes import ROOT


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("offline_site", ROOT / "scripts/offline_site.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


offline_site = _checker()

# What MkDocs Material writes into every page while its theme's font is on (mkdocs.yml
# turns it off).
GOOGLE_FONTS = (
    '<link rel="preconnect" href="https://fonts.gstatic.com" crossorigin>\n'
    '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto:300,400'
    '%7CRoboto+Mono:400&display=fallback">\n'
    '<style>:root{--md-text-font:"Roboto";--md-code-font:"Roboto Mono"}</style>'
)


def site(tmp_path: Path, files: dict[str, str]) -> Path:
    """A built site of ``files``, by their paths in it."""
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def page(head: str = "", body: str = "") -> str:
    return f"<!doctype html><html><head>{head}</head><body>{body}</body></html>"


def test_the_themes_google_fonts_are_found(tmp_path):
    found = offline_site.external_requests(site(tmp_path, {"index.html": page(GOOGLE_FONTS)}))
    assert found == [
        "index.html: <link rel='preconnect' href='https://fonts.gstatic.com'>",
        "index.html: <link rel='stylesheet' href='https://fonts.googleapis.com/css?family="
        "Roboto:300,400%7CRoboto+Mono:400&display=fallback'>",
    ]


@pytest.mark.parametrize(
    "head",
    [
        '<script src="https://unpkg.com/mermaid@11/dist/mermaid.min.js"></script>',
        '<script src="//cdn.jsdelivr.net/npm/mermaid"></script>',
        '<link rel="preload" as="font" href="https://example.com/f.woff2">',
        '<link rel="icon" href="http://example.com/favicon.ico">',
        "<style>@font-face{font-family:x;src:url(https://fonts.gstatic.com/x.woff2)}</style>",
        '<style>@import "https://fonts.googleapis.com/css?family=Roboto";</style>',
    ],
)
def test_a_script_stylesheet_or_font_from_another_host_is_found(tmp_path, head):
    assert len(offline_site.external_requests(site(tmp_path, {"a/b/index.html": page(head)}))) == 1


def test_a_stylesheet_that_loads_a_font_from_another_host_is_found(tmp_path):
    css = "@font-face{src:url('https://fonts.gstatic.com/s/roboto.woff2')}\nb{}"
    found = offline_site.external_requests(site(tmp_path, {"assets/main.css": css}))
    assert found == ["assets/main.css: https://fonts.gstatic.com/s/roboto.woff2"]


def test_what_the_site_serves_itself_and_the_links_a_reader_follows_are_fine(tmp_path):
    head = (
        '<link rel="stylesheet" href="assets/stylesheets/main.css">'
        '<script src="js/mermaid.min.js"></script>'
        '<link rel="canonical" href="https://example.com/docs/">'
    )
    body = (
        '<a href="https://docs.stripe.com/search">Stripe\'s search</a>'
        "<p>url(https://example.com) in prose, or in <code>@import 'https://x'</code></p>"
        '<img src="img/benchmark.png">'
    )
    css = "@font-face{src:url(../fonts/roboto.woff2)}b{background:url(data:image/png;base64,AA)}"
    built = site(tmp_path, {"index.html": page(head, body), "assets/main.css": css})
    assert offline_site.external_requests(built) == []


def test_the_command_fails_on_a_request_and_passes_without(tmp_path, capsys):
    clean = site(tmp_path / "clean", {"index.html": page()})
    assert offline_site.main(["offline_site.py", str(clean)]) == 0
    assert "1 pages, no request to another host" in capsys.readouterr().out
    fonts = site(tmp_path / "fonts", {"index.html": page(GOOGLE_FONTS)})
    assert offline_site.main(["offline_site.py", str(fonts)]) == 1
    assert "fonts.googleapis.com" in capsys.readouterr().err
