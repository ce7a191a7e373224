"""Render the figures README.md and docs/*.md quote from benchmarks/results/*.json, and check the pages.

A quoted figure sits between markers that name its entry in `benchmarks/figures.py`:

    3.45× transformers   written as   <!-- fig:engine.vs_transformers -->3.45×<!-- /fig --> transformers

and a whole table between `<!-- table:ID -->` and `<!-- /table -->`, each on a line of its own.

    .venv/bin/python benchmarks/report.py --check   # exit 1 and list every stale or unknown figure
    .venv/bin/python benchmarks/report.py --write   # rewrite the pages from the results files
    .venv/bin/python benchmarks/report.py --list    # every registered figure as it renders now

tests/docs/test_figures.py runs the check over the repository (so CI fails on a stale number).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import FIGURES, Figure  # noqa: E402  (benchmarks/figures.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INLINE = re.compile(r"<!-- fig:(?P<id>[\w.\-]+) -->(?P<text>.*?)<!-- /fig -->")
BLOCK = re.compile(r"<!-- table:(?P<id>[\w.\-]+) -->\n(?P<text>.*?)\n?<!-- /table -->", re.DOTALL)


@dataclass(frozen=True)
class Problem:
    path: Path
    line: int
    id: str
    quoted: str
    rendered: str          # what the figure renders to now, or why it cannot

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.id}: quoted {self.quoted!r}, renders {self.rendered!r}"


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(figure: Figure, results: Path) -> str:
    return figure.render(json.loads((results / figure.source).read_text())).strip()


def _rendered(fig_id: str, results: Path, cache: dict[str, str]) -> str:
    if fig_id not in cache:
        figure = FIGURES.get(fig_id)
        try:
            cache[fig_id] = render(figure, results) if figure else f"<unknown figure {fig_id}>"
        except (OSError, KeyError, ValueError, StopIteration, TypeError) as e:
            cache[fig_id] = f"<cannot render {fig_id} from {figure.source}: {type(e).__name__}: {e}>"
    return cache[fig_id]


def check_text(text: str, path: Path, results: Path, cache: dict[str, str] | None = None) -> list[Problem]:
    """Every marked figure in `text` whose quoted text differs from what it renders now."""
    cache = {} if cache is None else cache
    problems = []
    for pattern in (INLINE, BLOCK):
        for m in pattern.finditer(text):
            rendered = _rendered(m["id"], results, cache)
            if m["text"].strip() != rendered:
                problems.append(Problem(path, text.count("\n", 0, m.start()) + 1, m["id"], m["text"].strip(), rendered))
    return problems


def rewrite_text(text: str, results: Path, cache: dict[str, str] | None = None) -> str:
    cache = {} if cache is None else cache

    def ok(fig_id: str) -> str | None:
        r = _rendered(fig_id, results, cache)
        return None if r.startswith("<") else r

    text = INLINE.sub(lambda m: f"<!-- fig:{m['id']} -->{ok(m['id']) or m['text']}<!-- /fig -->", text)
    return BLOCK.sub(lambda m: f"<!-- table:{m['id']} -->\n{ok(m['id']) or m['text']}\n<!-- /table -->", text)


def check(root: Path, results: Path) -> list[Problem]:
    cache: dict[str, str] = {}
    return [p for page in pages(root) for p in check_text(page.read_text(), page.relative_to(root), results, cache)]


def write(root: Path, results: Path) -> list[Path]:
    changed, cache = [], {}
    for page in pages(root):
        text = page.read_text()
        new = rewrite_text(text, results, cache)
        if new != text:
            page.write_text(new)
            changed.append(page.relative_to(root))
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="list stale or unknown figures; exit 1 if any")
    mode.add_argument("--write", action="store_true", help="rewrite every marked figure from the results")
    mode.add_argument("--list", action="store_true", help="print every registered figure as it renders now")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository whose README.md and docs/ to read")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the results JSON")
    args = parser.parse_args()
    if args.list:
        for fig_id, figure in FIGURES.items():
            print(f"== {fig_id} ({figure.source})\n{_rendered(fig_id, args.results, {})}")
        return 0
    if args.write:
        for page in write(args.root, args.results):
            print(f"rewrote {page}")
    problems = check(args.root, args.results)
    for p in problems:
        print(p)
    print(f"{len(problems)} stale or unknown figure(s)" if problems else "every quoted figure matches its results file")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
