"""Engine cost profile: the fit recovers known costs, the JSON round-trips, the CLI measures and refuses bad flags."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from specfleet.cli.main import app
from specfleet.engine import profile_model
from specfleet.engine.profile_model import StepPoint, fit_profile, fit_steps

A, B, C = 0.004, 2e-5, 3e-8


def synthetic(kind: str, q: int) -> list[StepPoint]:
    return [StepPoint(kind, batch, ctx, q, A + B * batch * q + C * batch * q * ctx, 0.0, 1)
            for batch in (1, 2, 4, 8) for ctx in (128, 512, 2048)]


def test_fit_recovers_known_costs_exactly_from_synthetic_points():
    fit = fit_steps(synthetic("decode", 1))
    assert fit.a == pytest.approx(A, rel=1e-9)
    assert fit.b == pytest.approx(B, rel=1e-9)
    assert fit.c == pytest.approx(C, rel=1e-9)
    assert fit.rel_rms_error < 1e-9


def test_fit_per_kind_evaluates_step_time_by_query_length():
    profile = profile_model.Profile("m", "cpu", "float32", {}, "x", "now",
                                    synthetic("decode", 1) + synthetic("verify", 3), {})
    profile.fit = fit_profile(profile.points)
    assert set(profile.fit) == {"decode", "verify"}
    assert profile.step_seconds(16, 1000, 1) == pytest.approx(A + B * 16 + C * 16 * 1000, rel=1e-9)
    assert profile.step_seconds(16, 1000, 3) == pytest.approx(A + B * 48 + C * 48 * 1000, rel=1e-9)


def test_fit_reports_its_relative_error_on_noisy_points():
    points = [StepPoint("decode", p.batch, p.context, 1, p.median_s * (1.1 if i % 2 else 0.9), 0.0, 1)
              for i, p in enumerate(synthetic("decode", 1))]
    assert 0.05 < fit_steps(points).rel_rms_error < 0.15


def test_fit_minimizes_the_relative_error_it_reports_so_small_steps_are_priced_as_well_as_large_ones():
    """A cost that bends (a roofline's memory-bound rows, then compute-bound) fitted by a straight line:
    plain least squares lets the 50x slower steps decide, and the cheapest step comes out further off."""
    points = [StepPoint("decode", batch, ctx, 1, max(0.01, 0.0005 * batch), 0.0, 1)
              for batch in (1, 2, 4, 8, 16, 32, 512, 1024) for ctx in (512, 2048)]
    fit = fit_steps(points)
    tokens = np.array([p.batch for p in points], dtype=float)
    design = np.column_stack([np.ones_like(tokens), tokens, tokens * np.array([p.context for p in points])])
    measured = np.array([p.median_s for p in points])
    plain, *_ = np.linalg.lstsq(design, measured, rcond=None)
    plain_error = float(np.sqrt(np.mean(((design @ plain - measured) / measured) ** 2)))
    assert fit.rel_rms_error < 0.85 * plain_error
    cheapest = points[0]
    assert abs(fit.seconds(1, 512, 1) / cheapest.median_s - 1) < abs(design[0] @ plain / cheapest.median_s - 1) - 0.1


def test_a_fit_needs_more_points_than_parameters():
    """Three points fit a, b, c exactly: an error of 0 whatever the machine did, priced as a perfect fit."""
    with pytest.raises(ValueError, match="a decode fit has 3 parameters and needs at least 4 points, got 3"):
        fit_steps(synthetic("decode", 1)[:3])
    assert fit_steps(synthetic("decode", 1)[:4]).num_points == 4


def test_points_that_cannot_tell_the_parameters_apart_are_refused_not_split_silently():
    """One context: the cost per token and the cost per token per context token are the same column, and
    least squares would split the time between them arbitrarily (every price at another context off)."""
    points = [StepPoint("decode", b, 512, 1, A + B * b + C * b * 512, 0.0, 1) for b in (1, 2, 4, 8, 16)]
    with pytest.raises(ValueError, match=r"do not tell the fit's 3 parameters \(a, b, c\) apart \(rank 2\)"):
        fit_steps(points)


def test_a_joint_fit_with_as_many_points_as_parameters_is_refused_with_the_counts():
    points = [StepPoint("decode", b, c, 1, A + B * b + C * b * c, 0.0, 1) for b, c in ((1, 128), (4, 512), (8, 128))]
    points += [StepPoint("verify", b, c, 3, A + 3 * B * b + 3 * C * b * c, 0.0, 1)
               for b, c in ((1, 128), (4, 512), (8, 128))]
    with pytest.raises(ValueError) as refused:
        fit_profile(points)
    assert str(refused.value) == (
        "cannot fit the decode steps: 3 decode and 3 verify points; a decode fit alone has 3 parameters (a, b, c) "
        "and needs at least 4 points, one with the verify steps has 6 and needs at least 3 of each kind and 7 in all")


def test_a_kind_with_too_few_points_is_left_out_and_says_why():
    points = synthetic("decode", 1) + synthetic("prefill", 64)[:3]
    fits = fit_profile(points)
    assert set(fits) == {"decode"}
    assert profile_model.left_out(points, fits) == [
        "prefill: not fitted, 3 points; a prefill fit has 3 parameters and needs at least 4"]


def test_profile_round_trips_and_refuses_other_versions(tmp_path):
    points = synthetic("decode", 1)
    profile = profile_model.Profile("m", "cpu", "float32", {"cpu": "x", "cores": 2}, "abc", "now", points,
                                    fit_profile(points), [profile_model.Acceptance("copy-heavy", 2, 10, 4)])
    path = tmp_path / "p.json"
    profile_model.save(profile, path)
    loaded = profile_model.load(path)
    assert loaded.points == points and loaded.fit == profile.fit and loaded.acceptance == profile.acceptance
    assert json.loads(path.read_text())["acceptance"][0]["rate"] == 0.4
    with pytest.raises(ValueError, match="version 2 is not supported"):
        profile_model.from_json(dict(json.loads(path.read_text()), version=2))


def test_profile_model_imports_without_torch(tmp_path):
    code = "import sys, specfleet.engine.profile_model; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0


PROFILE_ARGS = ["--max-batch", "2", "--max-k", "1", "--contexts", "16,32", "--chunks", "8,16",
                "--repeats", "2", "--warmup", "0", "--max-tokens", "6", "--device", "cpu", "--threads", "1"]


def test_cli_writes_a_versioned_profile_with_the_measured_grid(tiny_llama, tmp_path):
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(app, ["engine", "profile", "--model", tiny_llama, "-o", str(out), *PROFILE_ARGS])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["version"] == 1 and data["model"] == tiny_llama and data["device"] == "cpu"
    assert data["dtype"] == "float32" and data["host"]["cores"] >= 1 and data["engine_commit"]
    grid = {(p["kind"], p["batch"], p["context"], p["q"]) for p in data["points"]}
    assert grid == ({("decode", b, c, 1) for b in (1, 2) for c in (16, 32)}
                    | {("verify", b, c, 2) for b in (1, 2) for c in (16, 32)}
                    | {("prefill", 1, c, n) for n in (8, 16) for c in (16, 32)})
    assert all(p["repeats"] == 2 and p["median_s"] > 0 and p["spread_s"] >= 0 for p in data["points"])
    assert set(data["fit"]) == {"decode", "verify", "prefill"}
    assert {(a["workload"], a["k"]) for a in data["acceptance"]} == {("copy-heavy", 1), ("open-ended", 1)}
    assert all(0 <= a["accepted_tokens"] <= a["draft_tokens"] for a in data["acceptance"])
    loaded = profile_model.load(out)
    assert loaded.step_seconds(2, 32, 1) == pytest.approx(loaded.fit["decode"].seconds(2, 32, 1))


def test_cli_measures_acceptance_on_a_prompt_file(tiny_llama, tmp_path):
    prompts = tmp_path / "mine.txt"
    prompts.write_text("copy this: a b c a b c a b c\n\nand this: x y x y x y\n")
    out = tmp_path / "profile.json"
    args = ["engine", "profile", "--model", tiny_llama, "-o", str(out), "--prompts", str(prompts), *PROFILE_ARGS]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert [a["workload"] for a in json.loads(out.read_text())["acceptance"]] == ["mine"]


@pytest.mark.parametrize("flags, message", [
    (["--max-batch", "0"], "--max-batch"),
    (["--contexts", "16,abc"], "comma-separated integers"),
    (["--chunks", "0"], "positive integers"),
    (["--threads", "0"], "threads must be >= 1"),
    (["--contexts", "5000"], "lower --contexts"),
])
def test_cli_refuses_bad_flags_with_a_clear_error(tiny_llama, tmp_path, flags, message):
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(app, ["engine", "profile", "--model", tiny_llama, "-o", str(out), "--device", "cpu",
                                      *flags])
    assert result.exit_code == 2
    assert message in result.output
    assert not out.exists()


def test_cli_refuses_a_grid_too_small_to_fit_and_writes_nothing(tiny_llama, tmp_path):
    out = tmp_path / "profile.json"
    args = ["engine", "profile", "--model", tiny_llama, "-o", str(out), *PROFILE_ARGS, "--max-batch", "1",
            "--contexts", "16"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 2
    assert "cannot fit the decode steps: 1 decode and 1 verify points" in result.output
    assert not out.exists()


def test_decode_and_verify_are_fitted_together_with_a_cost_per_sequence():
    """T = a_kind + s.batch + b.tokens + c.tokens.ctx: verification points (q > 1) tell s from b."""
    s, a_verify = 1.5e-3, 0.009

    def point(kind: str, batch: int, ctx: int, q: int) -> StepPoint:
        a = A if kind == "decode" else a_verify
        return StepPoint(kind, batch, ctx, q, a + s * batch + B * batch * q + C * batch * q * ctx, 0.0, 1,
                         tokens=batch * q)
    points = [point("decode", b, c, 1) for b in (1, 4, 16) for c in (128, 512)]
    points += [point("verify", b, c, q) for b in (1, 4, 16) for c in (128, 512) for q in (2, 3, 5)]
    fits = fit_profile(points)
    decode, verify = fits["decode"], fits["verify"]
    assert (decode.a, verify.a) == (pytest.approx(A, rel=1e-6), pytest.approx(a_verify, rel=1e-6))
    assert decode.s == verify.s == pytest.approx(s, rel=1e-6) and decode.b == pytest.approx(B, rel=1e-6)
    assert verify.seconds(8, 256, 2.5) == pytest.approx(a_verify + s * 8 + (B + C * 256) * 20, rel=1e-6)


def test_attention_that_reads_each_sequences_kv_once_is_told_from_attention_per_query_token():
    """Where memory bounds attention (a GPU's decode), a verification of q tokens reads its KV once: the cost
    grows with batch x context, not tokens x context, and the fit says so (sc, with c ~ 0)."""
    sc = 4e-8

    def point(kind: str, batch: int, ctx: int, q: int) -> StepPoint:
        return StepPoint(kind, batch, ctx, q, A + B * batch * q + sc * batch * ctx, 0.0, 1, tokens=batch * q)
    points = [point("decode", b, c, 1) for b in (1, 4, 16, 64) for c in (512, 2048)]
    points += [point("verify", b, c, q) for b in (1, 4, 16, 64) for c in (512, 2048) for q in (3, 5)]
    fits = fit_profile(points)
    assert fits["verify"].sc == pytest.approx(sc, rel=1e-6) and abs(fits["verify"].c) < 1e-15
    assert fits["verify"].rel_rms_error < 1e-9
    assert fits["verify"].seconds(32, 1024, 5) == pytest.approx(A + B * 160 + sc * 32 * 1024, rel=1e-6)


def test_a_knee_in_the_cost_per_token_is_found_where_it_is_and_not_where_there_is_none():
    """Few-row steps (one linear kernel) cost more per token than many-row ones (the GEMM): T bends at 12."""
    knee, b2 = 12, -B / 2

    def point(kind: str, batch: int, ctx: int, q: int, bend: float) -> StepPoint:
        tokens = batch * q
        cost = A + B * tokens + bend * max(tokens - knee, 0) + C * tokens * ctx
        return StepPoint(kind, batch, ctx, q, cost, 0.0, 1, tokens=tokens)

    def grid(bend: float) -> list[StepPoint]:
        return ([point("decode", b, c, 1, bend) for b in (1, 2, 4, 8, 16, 32, 64) for c in (128, 512)]
                + [point("verify", b, c, q, bend) for b in (1, 2, 4, 8, 16, 32) for c in (128, 512) for q in (2, 3)])

    bent = fit_profile(grid(b2))
    assert bent["decode"].knee == bent["verify"].knee == knee
    assert bent["decode"].b2 == pytest.approx(b2, rel=1e-6) and bent["decode"].rel_rms_error < 1e-9
    assert bent["decode"].b_past_knee == pytest.approx(B + b2, rel=1e-6)
    assert bent["decode"].seconds(40, 256, 1) == pytest.approx(A + B * 40 + b2 * 28 + C * 40 * 256, rel=1e-6)
    straight = fit_profile(grid(0.0))
    assert straight["decode"].b2 == 0.0 and straight["decode"].knee == 0.0


def test_a_profile_written_before_the_knee_loads_without_one(tmp_path):
    points = synthetic("decode", 1)
    data = profile_model.Profile("m", "cpu", "float32", {}, "abc", "now", points, fit_profile(points)).to_json()
    for fit in data["fit"].values():
        del fit["knee"], fit["b2"]
    decode = profile_model.from_json(data).fit["decode"]
    assert (decode.knee, decode.b2) == (0.0, 0.0) and decode.seconds(4, 128, 1) == pytest.approx(A + B * 4 + C * 512)


def test_refit_fits_a_stored_profile_again_from_its_points_and_keeps_what_was_measured(tmp_path):
    points = synthetic("decode", 1)
    stale = profile_model.StepFit(1.0, 0.0, 0.0, 0.5, len(points))
    path = tmp_path / "p.json"
    profile_model.save(profile_model.Profile("m", "cpu", "float32", {"cores": 2}, "abc", "then", points,
                                             {"decode": stale}), path)
    result = CliRunner().invoke(app, ["engine", "refit-profile", str(path)])
    assert result.exit_code == 0, result.output
    assert "decode: ±0.0% (was ±50.0%)" in result.output
    refitted = profile_model.load(path)
    assert refitted.points == points and (refitted.engine_commit, refitted.created) == ("abc", "then")
    assert refitted.fit["decode"].a == pytest.approx(A, rel=1e-9)


def test_refit_refuses_a_profile_with_too_few_points_and_says_how_many_a_fit_needs(tmp_path):
    path = tmp_path / "p.json"
    profile_model.save(profile_model.Profile("m", "cpu", "float32", {}, "abc", "then", synthetic("decode", 1)[:2],
                                             {}), path)
    before = path.read_text()
    result = CliRunner().invoke(app, ["engine", "refit-profile", str(path)], env={"COLUMNS": "400"})
    assert result.exit_code == 2
    assert ("cannot fit the decode steps: 2 decode and 0 verify points; a decode fit alone has 3 parameters "
            "(a, b, c) and needs at least 4 points") in result.output
    assert path.read_text() == before


def test_refit_says_which_kinds_it_left_out_for_too_few_points(tmp_path):
    path = tmp_path / "p.json"
    points = synthetic("decode", 1) + synthetic("prefill", 64)[:2]
    profile_model.save(profile_model.Profile("m", "cpu", "float32", {}, "abc", "then", points, {}), path)
    result = CliRunner().invoke(app, ["engine", "refit-profile", str(path)])
    assert result.exit_code == 0, result.output
    assert "prefill: not fitted, 2 points; a prefill fit has 3 parameters and needs at least 4" in result.output


def test_a_point_is_fitted_on_the_tokens_its_steps_computed():
    points = [StepPoint("decode", b, c, 1, A + B * b * 3 + C * b * 3 * c, 0.0, 1, tokens=b * 3)
              for b in (1, 2, 4, 8) for c in (128, 512)]
    assert fit_steps(points).b == pytest.approx(B, rel=1e-9)


def test_passes_merge_into_the_median_of_their_medians_with_a_spread_covering_their_drift():
    from specfleet.engine.profiler import merge_passes

    passes = [StepPoint("decode", 4, 128, 1, m, 0.002, 5, tokens=4) for m in (0.040, 0.050, 0.046)]
    merged = merge_passes(passes)
    assert merged.median_s == pytest.approx(0.046) and merged.repeats == 15 and merged.tokens == 4
    assert merged.spread_s == pytest.approx(0.051 - 0.039)


def test_a_bent_fit_prices_floats_as_floats_and_arrays_as_arrays():
    """Plans are written as YAML/JSON: a numpy scalar from the knee term would not serialize."""
    import numpy as np

    fit = profile_model.StepFit(A, B, C, 0.0, 10, knee=12.0, b2=-B / 2)
    assert type(fit.seconds(20, 256, 1)) is float
    batches = np.array([4.0, 20.0])
    assert fit.seconds(batches, 256, 1).tolist() == pytest.approx([fit.seconds(4, 256, 1), fit.seconds(20, 256, 1)])
