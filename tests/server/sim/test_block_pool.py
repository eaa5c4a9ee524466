"""The block pool against a plain reference model: allocation never exceeds the free
blocks, freed content stays reusable until its block is handed out again (LRU), and
a prefix lookup finds exactly the blocks that survived."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentmars.server.sim.block_pool import INDEX_MASK, BlockPool, CPUTier, block_key

NUM_BLOCKS = 12
OWNERS = (1, 2)


class Reference:
    """What the pool should hold, kept the slow, obvious way."""

    def __init__(self) -> None:
        self.refs = [0] * NUM_BLOCKS
        self.content: dict[int, int] = {}  # block -> key
        self.evicted = 0

    def prefix(self, owner: int, limit: int) -> tuple[int, int]:
        by_key = {key: block for block, key in self.content.items()}
        count = 0
        while count < limit and block_key(owner, count) in by_key:
            count += 1
        free = sum(1 for i in range(count) if self.refs[by_key[block_key(owner, i)]] == 0)
        return count, free


ops = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(1, 5)),
        st.tuples(st.just("free"), st.integers(0, 10)),
        st.tuples(st.just("cache"), st.sampled_from(OWNERS)),
        st.tuples(st.just("hit"), st.sampled_from(OWNERS)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops)
def test_pool_matches_the_reference(ops: list[tuple[str, int]]) -> None:
    evicted: list[int] = []
    pool = BlockPool(NUM_BLOCKS, evicted.extend)
    ref = Reference()
    held: list[list[int]] = []
    next_index = dict.fromkeys(OWNERS, 0)
    for op, arg in ops:
        if op == "allocate":
            blocks = pool.allocate(arg)
            if arg > NUM_BLOCKS - sum(1 for r in ref.refs if r):
                assert blocks is None
                continue
            assert blocks is not None and len(set(blocks)) == arg
            for block in blocks:
                assert ref.refs[block] == 0
                ref.refs[block] = 1
                if block in ref.content:
                    ref.evicted += 1
                    del ref.content[block]
            held.append(blocks)
        elif op == "free" and held:
            blocks = held.pop(arg % len(held))
            pool.free(blocks)
            for block in blocks:
                ref.refs[block] -= 1
        elif op == "cache" and held:
            # Name the blocks of the newest allocation as the owner's next blocks.
            for block in held[-1]:
                key = block_key(arg, next_index[arg])
                if block not in ref.content and key not in ref.content.values():
                    ref.content[block] = key
                    next_index[arg] += 1
                pool.cache_run([block], arg, key & INDEX_MASK)
        elif op == "hit":
            count, _ = pool.prefix(arg, NUM_BLOCKS)
            blocks = pool.prefix_blocks(arg, count)
            pool.touch(blocks)
            for block in blocks:
                ref.refs[block] += 1
            held.append(blocks)
        assert pool.num_free == sum(1 for r in ref.refs if r == 0)
        assert len(evicted) == ref.evicted
        for owner in OWNERS:
            for limit in (0, 1, 3, NUM_BLOCKS):
                assert pool.prefix(owner, limit) == ref.prefix(owner, limit)


def test_freed_blocks_are_reused_least_recently_freed_first_tail_first() -> None:
    pool = BlockPool(4, lambda keys: None)
    a = pool.allocate(2)
    b = pool.allocate(2)
    assert a is not None and b is not None
    pool.free(a)  # a's tail joins the queue before its head
    pool.free(b)
    assert pool.allocate(4) == [a[1], a[0], b[1], b[0]]


def test_reallocating_a_cached_block_evicts_its_content() -> None:
    evicted: list[int] = []
    pool = BlockPool(1, evicted.extend)
    (block,) = pool.allocate(1) or []
    pool.cache_run([block], 1, 0)
    pool.free([block])
    assert pool.prefix(1, 5) == (1, 1)  # still reusable
    pool.allocate(1)
    assert evicted == [block_key(1, 0)] and pool.prefix(1, 5) == (0, 0)


def test_cpu_tier_keeps_the_most_recently_used_blocks() -> None:
    tier = CPUTier(capacity=2)
    tier.cache([1, 2])
    assert tier.prefix([1]) == 1  # 1 is now the most recent
    tier.cache([3])
    assert tier.prefix([2]) == 0 and tier.prefix([1, 3]) == 2


def test_cached_copies_give_way_to_swapped_ones_and_count_as_free() -> None:
    # Four blocks of host memory, three holding offloaded prefix-cache copies: all
    # four are still room a swap-out can use (the LRU gives way).
    tier = CPUTier(capacity=4)
    tier.cache([1, 2, 3])
    assert tier.free == 4
    assert tier.hold("s", [10, 11, 12]) == 3  # evicts 1 and 2, the least recent
    assert tier.free == 1 and tier.used == 4
    assert tier.prefix([10, 11, 12]) == 3 and tier.prefix([1]) == 0 and tier.prefix([3]) == 1
    # Loaded back: the session's copies are freed, the cached one stays.
    tier.release("s")
    assert tier.free == 4 and tier.used == 1
    assert tier.prefix([10]) == 0 and tier.prefix([3]) == 1


def test_swapped_copies_are_never_evicted() -> None:
    tier = CPUTier(capacity=2)
    assert tier.hold("a", [1, 2]) == 2
    assert tier.hold("b", [3, 4]) == 0  # no room, nothing reclaimable
    tier.cache([5])  # an offload finds no room either
    assert tier.prefix([1, 2]) == 2 and tier.prefix([3]) == 0 and tier.prefix([5]) == 0


def test_a_copy_two_sessions_swapped_stays_until_both_let_go() -> None:
    # A shared system prompt's block, swapped out with each of two sessions.
    tier = CPUTier(capacity=2)
    tier.hold("a", [7])
    tier.hold("b", [7])
    assert tier.free == 1
    tier.release("a")
    assert tier.prefix([7]) == 1
    tier.release("b")
    assert tier.prefix([7]) == 0 and tier.free == 2
