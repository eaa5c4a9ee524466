"""The plugin's view of vLLM's scheduler, read from plain objects that carry what it
reads of vLLM's (this module imports no vLLM): the running calls' KV growth."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace

from agentmars.server.engines.vllm.pins import PinTable
from agentmars.server.engines.vllm.views import SchedulerView, SessionBook

BLOCK = 16


@dataclass(eq=False)
class Request:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int


@dataclass
class Scheduler:
    """What ``SchedulerView`` reads of vLLM's scheduler for the growth: the running
    requests, and each one's blocks (its KV cache manager's ``req_to_blocks``)."""

    running: list[Request] = field(default_factory=list)
    held: dict[str, list[int]] = field(default_factory=dict)
    block_size: int = BLOCK

    @property
    def kv_cache_manager(self) -> SimpleNamespace:
        group = SimpleNamespace(req_to_blocks=self.held)
        pool = SimpleNamespace(num_gpu_blocks=1025, free_block_queue=None)
        return SimpleNamespace(
            block_pool=pool, coordinator=SimpleNamespace(single_type_managers=[group])
        )


def make_view(scheduler: Scheduler) -> tuple[SchedulerView, SessionBook]:
    book = SessionBook()
    return SchedulerView(scheduler, PinTable(None, BLOCK), book), book


def growth_by_hand(scheduler: Scheduler) -> int:
    total = 0
    for request in scheduler.running:
        whole = -(-(request.num_prompt_tokens + request.max_tokens) // BLOCK)
        total += max(whole - len(scheduler.held.get(request.request_id, [])), 0)
    return total


def test_growth_is_what_each_running_call_still_takes_to_its_whole_need() -> None:
    # 100 + 28 tokens: 8 blocks, 3 held; 40 + 8: 3 blocks, none held; 17 + 15: 2
    # blocks, 3 held (a drafter's lookahead can overshoot): it grows none.
    scheduler = Scheduler(
        running=[Request("a", 100, 28), Request("b", 40, 8), Request("c", 17, 15)],
        held={"a": [1, 2, 3], "c": [4, 5, 6]},
    )
    view, _ = make_view(scheduler)
    assert view.running_growth_blocks == 5 + 3 + 0
    scheduler.held["a"].append(7)  # a step gave "a" one more block
    scheduler.running.remove(scheduler.running[1])  # "b" was preempted
    assert view.running_growth_blocks == 4


def test_growth_matches_the_direct_count_over_random_steps() -> None:
    rng = random.Random(0)
    scheduler = Scheduler()
    view, _ = make_view(scheduler)
    for step in range(300):
        if rng.random() < 0.4:
            request = Request(f"r{step}", rng.randint(1, 2000), rng.randint(1, 300))
            scheduler.running.append(request)
        for request in scheduler.running:
            blocks = scheduler.held.setdefault(request.request_id, [])
            blocks.extend(range(rng.randint(0, 3)))
        if scheduler.running and rng.random() < 0.3:
            gone = scheduler.running.pop(rng.randrange(len(scheduler.running)))
            del scheduler.held[gone.request_id]
        growth = growth_by_hand(scheduler)
        assert view.running_growth_blocks == growth, f"step {step}"
        # Counted up to a cap, as a policy comparing it with the free blocks asks.
        for cap in (0, 1, max(growth - 1, 0), growth, growth + 1, rng.randint(0, 2 * growth + 2)):
            assert view.running_growth_up_to(cap) == min(growth, cap), f"step {step} cap {cap}"
