"""The bench's robustness: three alternating runs a side by default, their spread, and its warning."""

from __future__ import annotations

import pytest

from app.cli.bench import SPREAD_WARNING, PromptReport, RunResult, spread
from app.cli.commands import build_parser
from app.engine.stats import SpecStats


def _report(plain: list[float], spec: list[float]) -> PromptReport:
    run = RunResult([1, 2], "ab", SpecStats())
    report = PromptReport("edit-rename", "code-edit", run, run, True)
    report.plain_runs, report.spec_runs = plain, spec
    return report


def test_each_side_runs_three_times_by_default_and_the_trace_mode_is_a_flag(
    capsys: pytest.CaptureFixture,
) -> None:
    parser = build_parser()
    assert parser.parse_args(["bench"]).repeat == 3
    assert parser.parse_args(["bench", "--trace", "replay"]).trace == "replay"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--help"])
    assert "trace: record" in capsys.readouterr().out


def test_the_spread_is_the_range_over_the_median() -> None:
    assert spread([100.0, 90.0, 110.0]) == pytest.approx(0.2)
    assert spread([50.0]) == 0.0
    assert spread([]) == 0.0


def test_a_spread_past_ten_percent_is_named_in_a_warning() -> None:
    steady = _report([100.0, 101.0, 99.0], [150.0, 152.0, 149.0])
    assert steady.warnings() == []
    assert steady.as_dict()["warnings"] == []
    noisy = _report([100.0, 101.0, 99.0], [150.0, 120.0, 149.0])
    (warning,) = noisy.warnings()
    assert warning.startswith("warning: edit-rename: the speculative runs spread 20%")
    assert f"more than {100 * SPREAD_WARNING:.0f}%" in warning
    row = noisy.as_dict()
    assert row["spec_spread"] == pytest.approx(30 / 149, abs=1e-4)
    assert row["warnings"] == [warning]
