"""No dangling link in the documents: every relative Markdown link names a file of the repository,
and every ``#anchor`` a heading of the file it points to (GitHub's heading slugs)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "REPRODUCE.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text, flags=re.U)
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    text = FENCE.sub("", md.read_text())
    out.update(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    for line in text.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(md: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", md.read_text())) if not re.match(r"[a-z]+:", t)]


def problems(md: Path) -> list[str]:
    out = []
    for target in links(md):
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            out.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    return out


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dangling_links(md):
    assert not problems(md)


def test_section_references_are_links():
    """A prose reference such as "FIGURES.md § deletion latency" cannot be checked: use a link."""
    bad = [f"{md.relative_to(ROOT)}: {m}" for md in DOCS
           for m in re.findall(r"[\w./]+\.md §[^|\n]{0,40}", FENCE.sub("", md.read_text()))]
    assert not bad, bad


def test_the_link_check_can_fail(tmp_path):
    (tmp_path / "b.md").write_text("# Real heading\n")
    a = tmp_path / "a.md"
    a.write_text("[x](b.md#real-heading) [y](b.md#missing) [z](nope.md) [w](https://example.org)\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert problems(a) == ["a.md: b.md#missing (no such heading)", "a.md: nope.md (no such file)"]
    finally:
        ROOT = old
    assert slug("Held-out SpO2 control (demo)") == "held-out-spo2-control-demo"
    assert slug("`forgetful` — the *main* job") == "forgetful--the-main-job"


#: a code span naming a path under one of the packages (``pipelines/store/forget.py``, ``sv_core/batched/``)
PACKAGE_PATH = re.compile(r"`((?:sv_core|cohort|models|evaluation|pipelines|dashboards)/[\w/]*(?:\.py|/))`")


def package_paths(text: str) -> list[str]:
    return PACKAGE_PATH.findall(text)


def test_architecture_names_only_modules_that_exist():
    """docs/ARCHITECTURE.md is the map a new engineer walks: every module or room it names exists."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = package_paths(text)
    assert len(named) > 40
    missing = sorted({p for p in named if not (ROOT / p).exists()})
    assert not missing, f"docs/ARCHITECTURE.md names modules that are not there: {missing}"


def test_the_path_check_can_fail():
    assert package_paths("see `pipelines/ingest_flow.py` and `sv_core/batched/` and `x/y.py`") == [
        "pipelines/ingest_flow.py", "sv_core/batched/"]
    assert not (ROOT / "pipelines/ingest_flow.py").exists()
