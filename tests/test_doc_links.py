"""Every relative link in the README and under docs/ (study pages included) names a file or folder that exists, so
moving a published study cannot leave a page pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "runs" not in p.parts)]


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)   # code blocks hold no links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue                                                                   # a URL or an anchor
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_a_missing_target_is_reported(tmp_path):
    (tmp_path / "here.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[a](here.md) [b](gone.md#part) [c](https://example.org) [d](#top)\n```\n[e](none.md)\n```\n")
    assert broken_links(page) == ["gone.md#part"]
