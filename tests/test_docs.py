"""The README and docs/ stay true: links resolve, Python blocks run, commands exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# ```python blocks run as written; a block fenced ```python no-run shows a long job (a whole
# report) whose pieces the other tests run.
BLOCK = re.compile(r"```(\w+)([^\n]*)\n(.*?)```", flags=re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    body = BLOCK.sub("", page.read_text())
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", body, flags=re.M)}


def test_there_are_docs_pages():
    names = {p.name for p in PAGES}
    assert {"README.md", "benchmarks.md", "data.md", "calibration.md"} <= names


def test_the_readme_stays_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    for target in LINK.findall(BLOCK.sub("", page.read_text())):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target} does not resolve"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


def _blocks(kind: str):
    for page in PAGES:
        for m in BLOCK.finditer(page.read_text()):
            if m.group(1) == kind:
                yield page, m.group(2).strip(), m.group(3)


@pytest.mark.parametrize(
    "page,code",
    [(p, c) for p, flags, c in _blocks("python") if flags != "no-run"],
    ids=lambda v: v.name if isinstance(v, Path) else "",
)
def test_python_blocks_run(page, code, monkeypatch):
    monkeypatch.chdir(ROOT)
    exec(compile(code, str(page), "exec"), {"__name__": "__docs__"})  # noqa: S102 - our docs


def test_every_command_shown_exists():
    from ctrcal.cli import build_parser

    parser = build_parser()
    subcommands = next(
        a.choices for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"
    )
    for page, _, code in _blocks("bash"):
        for m in re.finditer(r"^\s*ctrcal (\S+)", code, flags=re.M):
            assert m.group(1) in subcommands, f"{page.name}: unknown command ctrcal {m.group(1)}"
