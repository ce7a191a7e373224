"""Every figure README.md and docs/*.md quote matches what benchmarks/report.py renders from benchmarks/results/,
and the check catches a stale one."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import report  # noqa: E402  (benchmarks/report.py)
from figures import FIGURES, provenance  # noqa: E402  (benchmarks/figures.py)


def test_every_quoted_figure_matches_its_results_file():
    problems = report.check(ROOT, report.RESULTS)
    assert not problems, "stale figures (run benchmarks/report.py --write):\n" + "\n".join(map(str, problems))


def test_every_registered_figure_renders_from_a_results_file_that_names_its_command_and_date():
    for fig_id, figure in FIGURES.items():
        assert not report._rendered(fig_id, report.RESULTS, {}).startswith("<"), fig_id
        recorded = provenance(json.loads((report.RESULTS / figure.source).read_text()))
        assert recorded["command"] and recorded["date"], figure.source


def _stale_copy(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("engine: <!-- fig:engine.vs_vllm -->1.06×<!-- /fig --> vLLM\n")
    (tmp_path / "docs" / "page.md").write_text(
        "before\n<!-- table:operator.failover -->\n| a stale | table |\n<!-- /table -->\n"
        "and <!-- fig:no.such.figure -->1<!-- /fig -->\n")
    return tmp_path


def test_the_check_fails_on_a_stale_number_and_names_it(tmp_path):
    root = _stale_copy(tmp_path)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/report.py"), "--check", "--root", str(root)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "README.md:1: engine.vs_vllm: quoted '1.06×', renders '1.08×'" in out.stdout
    assert "docs/page.md:2: operator.failover" in out.stdout
    assert "no.such.figure" in out.stdout and "3 stale or unknown figure(s)" in out.stdout


def test_write_rewrites_stale_figures_and_leaves_unknown_ones_to_the_check(tmp_path):
    root = _stale_copy(tmp_path)
    assert report.write(root, report.RESULTS) == [Path("README.md"), Path("docs/page.md")]
    assert (root / "README.md").read_text() == "engine: <!-- fig:engine.vs_vllm -->1.08×<!-- /fig --> vLLM\n"
    assert "| `kill -9` |" in (root / "docs/page.md").read_text()
    assert [p.id for p in report.check(root, report.RESULTS)] == ["no.such.figure"]
