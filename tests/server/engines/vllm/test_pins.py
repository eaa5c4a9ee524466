"""``PinTable`` over vLLM's real ``BlockPool`` (in the vLLM environment): expiry in
TTL order, a replaced pin's old expiry ignored, free blocks back to the baseline; each
pin and release announced (``kv_pin`` / ``kv_unpin``)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    from vllm.v1.core.block_pool import BlockPool
    from agentmars.sdk.events import KVPin, KVUnpin
    from agentmars.server.engines.vllm.pins import PinTable

    pool = BlockPool(num_gpu_blocks=11, enable_caching=True, hash_block_size=16)
    free = pool.get_num_free_blocks  # 10: block 0 is vLLM's null block
    assert free() == 10
    a, b = pool.get_new_blocks(3), pool.get_new_blocks(2)
    events, clock = [], [0.0]
    table = PinTable(pool, 16, announce=lambda make: events.append(make()), clock=lambda: clock[0])
    table.pin("a", a, now=0.0, ttl_s=5.0, session_arrival_s=0.0)
    table.pin("b", b, now=1.0, ttl_s=1.0, session_arrival_s=1.0)
    table.pin("c", a[:1], now=1.0, ttl_s=None, session_arrival_s=1.0)
    pool.free_blocks(a)
    pool.free_blocks(b)  # the calls' own references: the pins hold all five blocks
    assert (free(), table.pinned_blocks) == (5, 6)

    assert table.release_expired(1.9) == []
    clock[0] = 2.0
    assert [p.session_id for p in table.release_expired(2.0)] == ["b"]
    assert free() == 7
    pinned = [(e.session_id, e.blocks, e.ttl_s) for e in events if isinstance(e, KVPin)]
    assert pinned == [("a", 3, 5.0), ("b", 2, 1.0), ("c", 1, None)]
    (unpinned,) = [e for e in events if isinstance(e, KVUnpin)]
    assert (unpinned.session_id, unpinned.blocks, unpinned.reason) == ("b", 2, "expired")
    assert unpinned.held_s == 1.0 and {e.source for e in events} == {"engine"}
    events.clear()

    # A newer pin of "a" replaces the old one; the old expiry (5.0) must not release it.
    clock[0] = 3.0
    table.pin("a", a, now=3.0, ttl_s=10.0, session_arrival_s=0.0)
    assert free() == 7
    # The old pin's release comes first, so a reader never sees two pins of "a".
    assert [(e.kind, getattr(e, "reason", None), e.blocks) for e in events] == [
        ("kv_unpin", "replaced", 3), ("kv_pin", None, 3)]
    assert events[0].held_s == 3.0
    assert table.release_expired(6.0) == []
    assert [p.session_id for p in table.release_expired(13.0)] == ["a"]
    assert (free(), len(table)) == (9, 1)  # "c" has no TTL: it stays until released

    # Pins that come and go under a long TTL do not pile up in the expiry queue.
    for i in range(500):
        table.pin("d", b, now=20.0 + i, ttl_s=3600.0, session_arrival_s=0.0)
        table.release("d", "next_call")
    assert len(table.expiries) <= 2 * len(table) + 64
    assert table.release_all("shutdown") == 1
    assert (free(), table.pinned_blocks, table.released["expired"]) == (10, 0, 2)
    print("ok")
    """
)


@pytest.mark.slow
def test_pins_expire_in_ttl_order_over_vllms_block_pool(vllm_python: Path) -> None:
    done = subprocess.run(
        [str(vllm_python), "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


class _Pool:
    """A block pool that counts references (``touch`` / ``free_blocks``)."""

    def __init__(self) -> None:
        self.refs: dict[str, int] = {}
        self.freed: list[str] = []

    def touch(self, blocks: list[str]) -> None:
        for block in blocks:
            self.refs[block] = self.refs.get(block, 0) + 1

    def free_blocks(self, blocks: object) -> None:
        for block in blocks:  # type: ignore[attr-defined]
            self.refs[block] -= 1
            self.freed.append(block)


def test_a_partial_offload_gives_back_the_pins_tail_first_and_keeps_its_head() -> None:
    from agentmars.server.engines.vllm.pins import PinTable

    pool, events = _Pool(), []
    table = PinTable(pool, 16, announce=lambda make: events.append(make()), clock=lambda: 1.0)
    table.pin("s", ["b0", "b1", "b2", "b3"], now=0.0, ttl_s=None, session_arrival_s=0.0)
    assert table.release_tail("s", 2) == 2
    assert (pool.freed, table.get("s").held, table.pinned_blocks) == (["b3", "b2"], ["b0", "b1"], 2)
    assert [e.kind for e in events] == ["kv_pin"]  # still pinned: no kv_unpin
    assert table.release_tail("s", 5) == 2  # the rest: the whole pin goes
    assert (len(table), table.pinned_blocks, table.released["policy"]) == (0, 0, 1)
    assert table.release_tail("s", 1) == 0
