"""``agentmars bench plugin``'s parts that run without vLLM: the timed table, the
callgrind client requests' library and the reading of callgrind's dumps (the whole
command runs in tests/cli/test_bench_vllm.py)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentmars.bench.plugin import callgrind_dumps, callgrind_total, toggle_library

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind is a Debian package (apt-packages.txt)"
)


def test_the_toggle_library_is_built_once_and_does_nothing_outside_valgrind() -> None:
    library = toggle_library()
    assert toggle_library() == library  # cached by its source's hash
    ctypes.CDLL(str(library)).agentmars_toggle_collect()


@needs_valgrind
def test_callgrind_totals_are_read_from_a_real_run(tmp_path: Path) -> None:
    counts = tmp_path / "true.callgrind"
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counts}", "/bin/true"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    # /bin/true with its dynamic loader: tens of thousands of instructions at least.
    assert callgrind_total(counts.read_text()) > 10_000


@needs_valgrind
def test_a_run_that_collected_nothing_is_an_error(tmp_path: Path) -> None:
    # Collection off from the start and never toggled on: what a run whose toggles
    # did not fire writes.
    counts = tmp_path / "none.callgrind"
    subprocess.run(
        [
            "valgrind", "--tool=callgrind", "--collect-atstart=no",
            f"--callgrind-out-file={counts}", "/bin/true",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="callgrind counted nothing"):
        callgrind_total(counts.read_text())
    with pytest.raises(RuntimeError, match="callgrind counted nothing"):
        callgrind_total("")


@needs_valgrind
def test_each_named_dump_counts_what_its_toggles_collected(tmp_path: Path) -> None:
    # A Python program under callgrind, as the bench runs one: instrumentation started
    # after some uninstrumented work, then work inside the toggles counted into the dump
    # named after it, and work outside them into none.
    program = tmp_path / "program.py"
    program.write_text(
        "import ctypes, sys\n"
        "library = ctypes.CDLL(sys.argv[1])\n"
        "def work(n): return sum(i * i for i in range(n))\n"
        "work(50000)\n"
        "library.agentmars_start_instrumentation()\n"
        "library.agentmars_toggle_collect(); work(1000); library.agentmars_toggle_collect()\n"
        "library.agentmars_dump_stats(b'small')\n"
        "work(50000)\n"
        "library.agentmars_toggle_collect(); work(10000); library.agentmars_toggle_collect()\n"
        "library.agentmars_dump_stats(b'large')\n"
    )
    subprocess.run(
        [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
            f"--callgrind-out-file={tmp_path / 'counts'}",
            sys.executable, str(program), str(toggle_library()),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    counts = callgrind_dumps(tmp_path, "counts")
    assert set(counts) == {"small", "large"}
    # Ten times the work, about ten times the instructions; the 50,000 uncounted
    # squares would have made "large" six times larger.
    assert 5 < counts["large"] / counts["small"] < 15


def test_the_timed_table_names_the_policies_it_ran() -> None:
    from rich.console import Console

    from agentmars.bench.plugin import table

    def row(mean_us: float) -> dict[str, object]:
        return {
            "steps_per_run": 10,
            "schedule": {"p50_us": mean_us, "mean_us": mean_us},
            "prefix_lookups": {"us_per_step": 1.0, "hit_tokens_mean": 0.0},
        }

    ratio = {"p50": 1.2, "mean": 1.2, "per_run": 1.2, "paired": 1.2}
    figures = {
        "queue": {"sessions": 2, "turns": 1},
        "reps": 1,
        "same_tokens": True,
        "schedulers": {"stock": row(10.0), "mars-no-coscheduler": row(12.0)},
        "schedule_ratio_to_stock": {"mars-no-coscheduler": ratio},
    }
    console = Console(record=True, width=200)
    console.print(table(figures))
    text = console.export_text()
    assert "mars-no-coscheduler: the plugin with that policy." in text
    assert "continuum" not in text and "FAIL" in text
