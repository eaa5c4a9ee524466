"""The plugin's prefix lookup (``engines.vllm.prefix_lookup``), checked in the vLLM
environment against vLLM's own lookup: on every lookup of bench_schedule's queue
(warm sessions, pins, evictions under pressure), after a prefix-cache reset, on a hash
the map holds twice, under a cap on the hit, and by the layouts where it stands aside;
on vLLM 0.32 and, at the scheduler level, 0.33."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EVERY_LOOKUP_PROBE = """
import collections, json, sys
from vllm.v1.core.sched.scheduler import Scheduler
from agentmars.server.engines.vllm import bench_schedule as b
from agentmars.server.engines.vllm.prefix_lookup import PrefixLookup
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model

shape = b.SchedulerShape()
scheduler = b.make_scheduler(sys.argv[1], ensure_tiny_model(), shape)
ours = scheduler.__dict__["_get_local_prefix_cache_hit"]
seen = collections.Counter(plugins=isinstance(ours.__self__, PrefixLookup))

def compared(request, *cap):  # vLLM 0.33 passes a cap on the hit, 0.32 none
    mine = ours(request, *cap)
    theirs = Scheduler._get_local_prefix_cache_hit(scheduler, request, *cap)
    ids = lambda found: [[block.block_id for block in g] for g in found[0].blocks]
    seen["lookups"] += 1
    seen["equal"] += ids(mine) == ids(theirs) and mine[1:] == theirs[1:]
    seen["same blocks"] += all(
        a is b for g, h in zip(mine[0].blocks, theirs[0].blocks) for a, b in zip(g, h)
    )
    seen["hit tokens"] += mine[1]
    return mine

scheduler._get_local_prefix_cache_hit = compared
result = b.drive(scheduler, sys.argv[1], b.build_sessions(b.QueueShape()), shape.block_size)
seen["calls"] = len(result.output_tokens)
print(json.dumps(seen))
"""


@pytest.mark.parametrize(
    ("python", "policy"),
    [
        ("vllm_python", "fcfs"),
        ("vllm_python", "continuum"),
        ("vllm_python", "mars"),
        # On 0.33 (its scheduler only), the policy whose hits are longest.
        ("vllm033_python", "mars"),
    ],
    ids=["fcfs", "continuum", "mars", "mars-vllm0.33"],
)
def test_every_lookup_finds_what_vllms_own_finds(
    python: str, policy: str, request: pytest.FixtureRequest
) -> None:
    done = subprocess.run(
        [str(request.getfixturevalue(python)), "-c", EVERY_LOOKUP_PROBE, policy],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["plugins"] == 1  # the plugin's lookup, not vLLM's, answered vLLM's loop
    assert seen["calls"] == 256
    assert seen["lookups"] >= 256
    assert seen["equal"] == seen["same blocks"] == seen["lookups"]
    # Warm sessions: the lookups found blocks (a later turn's context is cached).
    assert seen["hit tokens"] > 0


TWICE_AND_ASIDE_PROBE = """
import dataclasses, json
import vllm
from agentmars.server.engines.vllm import bench_schedule as b
from agentmars.server.engines.vllm.prefix_lookup import PrefixLookup
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

shape = b.SchedulerShape()
scheduler = b.make_scheduler("mars", ensure_tiny_model(), shape)
call, factory = b.build_sessions(b.QueueShape())[0][0], b.RequestFactory(shape.block_size)
request = factory.make(call, [])
# A prompt of exactly the two cached blocks: its last block is recomputed for logits.
short = factory.make(dataclasses.replace(call, new_tokens=call.new_tokens[:32]), [])
pool = scheduler.kv_cache_manager.block_pool
lookup = PrefixLookup.of(scheduler)
# A reset (POST /reset_prefix_cache) gives the pool a new map, which the lookup reads.
assert pool.reset_prefix_cache()
# The prompt's first two blocks cached, the first of them twice (two blocks one hash).
first, again, second = pool.get_new_blocks(3)
for block, block_hash in ((first, request.block_hashes[0]), (again, request.block_hashes[0]),
                          (second, request.block_hashes[1])):
    key = make_block_hash_with_group_id(block_hash, 0)
    block.set_block_hash(key, shape.block_size)
    pool.cached_block_hash_to_block.insert(key, block)
found, tokens, boundary, diverged = lookup.hit(request)
theirs = scheduler.kv_cache_manager.get_computed_blocks(request)
out = {
    "ours": [block.block_id for block in found.blocks[0]], "tokens": tokens,
    "theirs": [block.block_id for block in theirs[0].blocks[0]], "their_tokens": theirs[1],
    "first": first.block_id, "second": second.block_id,
    "rest": [boundary, diverged],
    "short": [lookup.hit(short)[1], scheduler.kv_cache_manager.get_computed_blocks(short)[1]],
}
manager = scheduler.kv_cache_manager
try:
    their_capped = manager.get_computed_blocks(request, 16)[1]
except TypeError:  # vLLM 0.32: no cap
    their_capped = None
out["capped"] = [lookup.hit(request, 16)[1], their_capped]
out["series"] = ".".join(vllm.__version__.split(".")[:2])
manager.enable_kv_cache_events = True
out["with_kv_events"] = PrefixLookup.of(scheduler) is None
manager.enable_kv_cache_events = False
manager.coordinator.eagle_group_ids = {0}
out["with_eagle"] = PrefixLookup.of(scheduler) is None
manager.coordinator.eagle_group_ids = set()
out["plain"] = PrefixLookup.of(scheduler) is not None
print(json.dumps(out))
"""


def test_a_reset_a_twice_held_hash_a_cached_prompt_and_a_cap_as_vllm_layouts_aside(
    scheduler_vllm_python: Path,
) -> None:
    done = subprocess.run(
        [str(scheduler_vllm_python), "-c", TWICE_AND_ASIDE_PROBE],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ours"] == out["theirs"] == [out["first"], out["second"]]
    assert out["tokens"] == out["their_tokens"] == 32
    assert out["rest"] == [0, False]
    assert out["short"] == [16, 16]
    # A cap of 16 tokens (vLLM 0.33's max_cache_hit_length) stops the walk at one block.
    assert out["capped"] == [16, 16 if out["series"] == "0.33" else None]
    assert out["with_kv_events"] and out["with_eagle"] and out["plain"]
