"""vLLM 0.33 against 0.32 at the scheduler level: stock vLLM's ``Scheduler`` and the
plugin's with FCFS, Continuum and MARS make the same decisions, step for step, on both,
over four queue shapes, and the asynchronous schedulers over one, on a virtual clock
(``bench_schedule.decisions``: vLLM's own scheduler in-process, no model, made-up
outputs, so every step is exact). vLLM 0.33's wheel is CUDA-only: its scheduler runs
here beside the CPU env's torch (scripts/vllm033-env.sh), its engine does not
(docs/vllm-plugin.md "Compatibility")"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

DECISIONS_PROBE = """
import json
from agentmars.server.engines.vllm import bench_schedule as b
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model

Q, E = b.QueueShape, b.SchedulerShape
shapes = [
    # Calls wait for blocks; Continuum's pins are dropped under pressure.
    (Q(sessions=6, turns=3), E(kv_blocks=160)),
    # Fewer blocks: calls are preempted under Continuum and MARS.
    (Q(sessions=6, turns=3, seed=1), E(kv_blocks=110)),
    # Many short sessions, few seats and a small token budget: chunked prefills.
    (Q(sessions=12, turns=2, first_prompt=(64, 512), seed=2),
     E(kv_blocks=200, max_num_seqs=8, max_num_batched_tokens=512)),
    # Long sessions on a 256-token budget: every prompt in chunks, stock preempts.
    (Q(sessions=4, turns=5, seed=3), E(kv_blocks=150, max_num_batched_tokens=256)),
    # The first queue on the asynchronous schedulers (vLLM's GPU default).
    (Q(sessions=6, turns=3), E(kv_blocks=160, async_scheduler=True)),
]
print(json.dumps([b.decisions(ensure_tiny_model(), queue, engine) for queue, engine in shapes]))
"""


def _decisions(python: Path) -> list[dict[str, list[Any]]]:
    done = subprocess.run(
        [str(python), "-c", DECISIONS_PROBE],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found: list[dict[str, list[Any]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_vllm_033_decides_as_032_step_for_step(vllm_python: Path, vllm033_python: Path) -> None:
    on_032, on_033 = _decisions(vllm_python), _decisions(vllm033_python)
    assert len(on_032) == len(on_033) == 5
    for shape, (old, new) in enumerate(zip(on_032, on_033, strict=True)):
        assert set(old) == set(new) == {"stock", "fcfs", "continuum", "mars"}
        for name in old:
            assert old[name] == new[name], (shape, name)
    # Stepped one at a time, the asynchronous schedulers decide as the synchronous ones.
    assert on_032[4] == on_032[0]
    # The shapes make the policies decide otherwise than stock vLLM, and preempt.
    assert all(shape["continuum"] != shape["stock"] for shape in on_032)
    assert all(shape["mars"] != shape["stock"] for shape in on_032)
    preempted = {
        name for shape in on_032 for name, steps in shape.items() if any(s[1] for s in steps)
    }
    assert {"stock", "continuum", "mars"} <= preempted
