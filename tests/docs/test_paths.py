"""Every repository path and relative link that README.md and docs/*.md cite exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("benchmarks", "cli", "cluster", "crds", "docs", "engine", "images", "manifests", "operator", "tests")
# a path that starts at one of the repository's top-level folders, not inside a URL, a dotted name or another path
PATH = re.compile(r"(?<![\w/.:~-])((?:%s)/[\w./-]*)" % "|".join(TOP))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def is_output(line: str, path: str) -> bool:
    """A results file the line says a command writes (it exists once someone runs it)."""
    return path.startswith("benchmarks/results/") and any(w in line for w in ("writes", "->", "--out", "--json"))


def cited_paths(page: Path) -> list[tuple[int, str]]:
    cited = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in PATH.finditer(line):
            path = m.group(1).split("::")[0].rstrip(".,:;")
            if "*" not in path and "<" not in path and not is_output(line, path):
                cited.append((n, path))
    return cited


def cited_links(page: Path) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in enumerate(page.read_text().splitlines(), 1)
            for m in LINK.finditer(line) if not re.match(r"[a-z]+:", m.group(1))]


def test_every_cited_repository_path_exists():
    missing = [f"{page.relative_to(ROOT)}:{n}: {path}" for page in PAGES for n, path in cited_paths(page)
               if not (ROOT / path).exists()]
    assert not missing, "paths the docs cite that are not in the repository:\n" + "\n".join(missing)


def test_every_relative_link_resolves():
    missing = [f"{page.relative_to(ROOT)}:{n}: {link}" for page in PAGES for n, link in cited_links(page)
               if not (page.parent / link).exists()]
    assert not missing, "links that lead nowhere:\n" + "\n".join(missing)


def test_the_path_finder_sees_paths_and_skips_what_is_not_one(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("see `engine/cpu/linear.py`, operator/cost/ and tests/x.py::test_y.\n"
                    "not https://h/engine/x.py nor specfleet.operator/x nor /var/engine/x\n"
                    "it writes benchmarks/results/new.json\n")
    assert cited_paths(page) == [(1, "engine/cpu/linear.py"), (1, "operator/cost/"), (1, "tests/x.py")]


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_anchor_a_link_names_is_a_heading_of_its_page():
    missing = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in re.finditer(r"\]\(([^)\s#]*)#([^)\s]+)\)", line):
                target = (page.parent / m.group(1)) if m.group(1) else page
                if target.suffix != ".md" or not target.exists():
                    continue
                anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", target.read_text(), re.M)}
                if m.group(2) not in anchors:
                    missing.append(f"{page.relative_to(ROOT)}:{n}: {m.group(1)}#{m.group(2)}")
    assert not missing, "anchors that name no heading:\n" + "\n".join(missing)
