"""Every relative link in the README and docs/ names a file that exists and, with a #fragment,
a heading of that file (GitHub's anchors): a moved section or a renamed file breaks no link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation but '-' and '_' gone, spaces '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    lines = page.read_text().splitlines()
    return {anchor(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


def relative_links(page: Path) -> list[str]:
    found = LINK.findall(page.read_text())
    return [link for link in found if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no {path}")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{link}: no heading #{fragment} in {target.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_anchor_follows_githubs_rule() -> None:
    assert anchor(" The demo's verdict over time") == "the-demos-verdict-over-time"
    assert anchor(" Exact mode (`--exact`: CPU fp32, CUDA bf16 and fp32)") == (
        "exact-mode---exact-cpu-fp32-cuda-bf16-and-fp32"
    )
