"""``agentmars bench capacity``: the bisection against a hand-made monotone slowdown
(where it stops, after how many runs); the ratio's relation when a capacity is only a
bound; a small run end to end on the simulator; bad input refused with exit 2."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentmars.bench.capacity import Capacity, Probe, Search, find_capacity, halvings, ratio
from agentmars.cli.main import app

BOUND = 3.0


def linear(
    threshold: float, calls: list[float], unfinished_above: float = math.inf
) -> Callable[[float], Probe]:
    """A slowdown of ``rate * k`` that crosses ``BOUND`` exactly at ``threshold``."""

    def probe(rate: float) -> Probe:
        calls.append(rate)
        return Probe(rate, rate * BOUND / threshold, int(rate > unfinished_above))

    return probe


def search(low: float = 0.1, high: float = 1.0, cap: float = 64.0, tol: float = 0.05) -> Search:
    return Search(low=low, high=high, cap=cap, tolerance=tol, bound=BOUND)


def steps(lo: float, hi: float, tol: float) -> int:
    """Geometric halvings until hi / lo <= 1 + tol, in closed form."""
    return math.ceil(math.log2(math.log(hi / lo) / math.log(1 + tol)))


@pytest.mark.parametrize("threshold", [0.13, 0.37, 0.71, 0.99])
def test_bisection_within_the_bracket_stops_within_tolerance(threshold: float) -> None:
    calls: list[float] = []
    found = find_capacity(linear(threshold, calls), search())
    assert found.status == "found"
    lo, hi = found.bracket
    assert lo is not None and hi is not None
    assert lo <= threshold < hi and hi / lo <= 1.05
    assert found.rate == lo and (threshold - lo) / threshold <= 0.05
    # low, high, then ceil(log2(ln 10 / ln 1.05)) = 6 halvings, whatever the threshold
    assert found.runs == len(calls) == 2 + steps(0.1, 1.0, 0.05) == 8
    assert calls[:2] == [0.1, 1.0]
    assert found.p95_at_rate() == pytest.approx(lo * BOUND / threshold)


def test_the_high_end_doubles_until_it_fails() -> None:
    calls: list[float] = []
    found = find_capacity(linear(5.0, calls), search())
    assert calls[:5] == [0.1, 1.0, 2.0, 4.0, 8.0]  # 8 fails: the bracket is [4, 8]
    assert found.runs == 5 + steps(4.0, 8.0, 0.05) == 9
    lo, hi = found.bracket
    assert lo is not None and hi is not None and lo <= 5.0 < hi <= 1.05 * lo


def test_failing_at_the_low_end_or_meeting_at_the_cap_is_reported_as_a_bound() -> None:
    calls: list[float] = []
    below = find_capacity(linear(0.05, calls), search())
    assert (below.status, below.rate, below.runs, below.label()) == ("below", 0.1, 1, "< 0.1")
    above = find_capacity(linear(100.0, []), search(cap=6.0))
    assert above.status == "above" and above.label() == ">= 6"
    assert [p.rate for p in above.probes] == [0.1, 1.0, 2.0, 4.0, 6.0]


def test_a_run_with_unfinished_sessions_fails_the_bound() -> None:
    calls: list[float] = []
    found = find_capacity(linear(0.8, calls, unfinished_above=0.4), search())
    lo, hi = found.bracket
    assert lo is not None and hi is not None and lo <= 0.4 < hi


def test_halvings_matches_the_closed_form() -> None:
    assert halvings(0.05, 1.0, 0.05) == steps(0.05, 1.0, 0.05) == 6
    assert halvings(1.0, 1.04, 0.05) == 0


def capacity(status: str, rate: float) -> Capacity:
    return Capacity(status, rate, (rate, None), (Probe(rate, 1.0),))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("first", "others", "line"),
    [
        (("found", 0.6), {"b": ("found", 0.3), "c": ("found", 0.4)}, " = 1.50x (best other: c)"),
        (("above", 8.0), {"b": ("found", 2.0)}, " >= 4.00x (best other: b)"),
        (("found", 2.0), {"b": ("above", 8.0)}, " <= 0.25x (best other: b)"),
        (("found", 0.5), {"b": ("below", 0.1)}, " > 5.00x (best other: b)"),
        (("below", 0.1), {"b": ("found", 0.2)}, " < 0.50x (best other: b)"),
        (("below", 0.1), {"b": ("below", 0.1)}, ": n/a (a < 0.1, b < 0.1 sessions/s)"),
    ],
)
def test_the_ratio_says_how_it_bounds_the_true_one(
    first: tuple[str, float], others: dict[str, tuple[str, float]], line: str
) -> None:
    capacities = {"a": capacity(*first)} | {name: capacity(*c) for name, c in others.items()}
    assert ratio(capacities, "a").line() == f"capacity a / best other{line}"


def test_a_small_run_writes_its_capacities_and_prints_the_ratio(tmp_path: Path) -> None:
    args = ["bench", "capacity", "--profile", "cpu-tiny", "--sessions", "6"]
    args += ["--policies", "mars,fcfs", "--workloads", "ilr-1", "--slowdown", "1.4"]
    args += ["--low", "0.02", "--high", "0.5", "--tolerance", "0.2", "--out", str(tmp_path)]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    figures = json.loads((tmp_path / "results.json").read_text())
    assert (figures["profile"], figures["sessions"], figures["slowdown_bound"]) == (
        "cpu-tiny", 6, 1.4,
    )  # fmt: skip
    capacities = figures["workloads"]["ilr-1"]["capacity"]
    assert list(capacities) == ["mars", "fcfs"]
    for found in capacities.values():
        assert (found["status"], found["relation"], found["error"]) == ("found", "=", None)
        lo, hi = found["bracket"]
        assert found["capacity"] == lo and 0.02 <= lo < hi <= 1.2 * lo
        assert found["runs"] == len(found["probes"]) >= 3
        by_rate = {p["rate"]: p["p95_slowdown"] for p in found["probes"]}
        assert by_rate[lo] <= 1.4 < by_rate[hi]  # the bracket straddles the bound
    assert not list(tmp_path.glob(".*tmp"))  # written atomically: no temporary left
    expected = figures["workloads"]["ilr-1"]["ratio"]
    assert expected["value"] == capacities["mars"]["capacity"] / capacities["fcfs"]["capacity"]
    line = f"capacity mars / best other = {expected['value']:.2f}x (best other: fcfs)"
    assert line in done.output


def test_a_capacity_below_the_low_end_is_said_so(tmp_path: Path) -> None:
    args = ["bench", "capacity", "--profile", "cpu-tiny", "--sessions", "6", "--policies"]
    args += ["mars,fcfs", "--slowdown", "1.01", "--low", "2", "--high", "4"]
    done = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    figures = json.loads((tmp_path / "results.json").read_text())["workloads"]["ilr-1"]
    assert [c["runs"] for c in figures["capacity"].values()] == [1, 1]
    assert figures["ratio"]["value"] is None
    assert "< 2" in done.output
    assert "capacity mars / best other: n/a (mars < 2, fcfs < 2 sessions/s)" in done.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "mars,nope"], "unknown policy 'nope'"),
        (["--workloads", "ilr-9"], "--workloads: unknown 'ilr-9'"),
        (["--profile", "no-such-profile"], "unknown profile 'no-such-profile'"),
        (["--slowdown", "0"], "--slowdown must be a positive number"),
        (["--low", "-1"], "--low must be a positive number"),
        (["--tolerance", "0"], "--tolerance must be a positive number"),
        (["--low", "1", "--high", "0.5"], "--low (1) must be below --high (0.5)"),
        (["--high", "4", "--max-rate", "2"], "--max-rate (2) must be at least --high (4)"),
        (["--sessions", "0"], "--sessions"),
        (["--policies", " , "], "--policies: give at least one name"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], message: str, tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["bench", "capacity", *args, "--out", str(tmp_path / "o")])
    assert done.exit_code == 2
    assert message in done.output
    assert "Traceback" not in done.output
    assert not (tmp_path / "o").exists()


def test_a_failing_run_is_reported_for_its_policy_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentmars.bench import capacity as bench

    def measure(setting: object, workload: str, policy: str, rate: float, alone: object) -> Probe:
        if policy == "fcfs":
            raise RuntimeError("boom")
        return Probe(rate, rate * BOUND / 0.37)

    monkeypatch.setattr(bench, "isolated", lambda setting, workload: {})
    monkeypatch.setattr(bench, "measure", measure)
    args = ["bench", "capacity", "--profile", "cpu-tiny", "--policies", "mars,fcfs"]
    done = CliRunner().invoke(app, [*args, "--low", "0.1", "--out", str(tmp_path)])
    assert done.exit_code == 1, done.output
    assert "fcfs: RuntimeError: boom" in done.output
    assert "capacity mars / best other: n/a (no other policy to compare with)" in done.output
    figures = json.loads((tmp_path / "results.json").read_text())["workloads"]["ilr-1"]
    mars, fcfs = figures["capacity"]["mars"], figures["capacity"]["fcfs"]
    assert (mars["status"], mars["runs"]) == ("found", 2 + steps(0.1, 1.0, 0.05))
    assert abs(mars["capacity"] - 0.37) <= 0.05 * 0.37
    assert (fcfs["status"], fcfs["capacity"], fcfs["error"]) == (
        "error",
        None,
        "RuntimeError: boom",
    )
