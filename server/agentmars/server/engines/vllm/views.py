"""vLLM's requests and scheduler state as the policy interface's views
(``policies.interface.CallView`` and ``EngineView``).

A request's session metadata comes from its ``vllm_xargs`` (``sampling_params.
extra_args``: ``session_id``, ``turn``, ``follows_tool``, ``expects_tool``,
``next_tool``, ``expected_tool_s``, as the SDK and the gateway send them) and from
vLLM's own ``request.session_id`` (body ``session_id`` or header ``X-Session-ID``).
A request that names no session is a session of its own. This module imports no vLLM:
requests and the scheduler are read by attribute (notes/vllm-plugin.md "Request
metadata").
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from agentmars.sdk import wire
from agentmars.server.engines.vllm.pins import Pin, PinTable
from agentmars.server.policies.tool_activity import FollowsTools, ToolActivity

if TYPE_CHECKING:
    from agentmars.server.policies.views import CallView, CostEstimator

SESSION_MEMORY = 65_536
"""Sessions whose first arrival is remembered (ours: without the gateway's side channel
the plugin never hears a session end, so the oldest are forgotten past this many; a
forgotten session that comes back counts as new)."""


def _xargs(request: Any) -> Mapping[str, Any]:
    params = request.sampling_params
    extra = getattr(params, "extra_args", None) if params is not None else None
    # A dict check (vLLM's type), not Mapping: the ABC check cost more than the rest of
    # this, which runs for every waiting call at every step (bench_schedule).
    return extra if isinstance(extra, dict) else {}


def _named_session(xargs: Mapping[str, Any], request: Any) -> str | None:
    named = xargs.get(wire.SESSION_ID) or request.session_id
    return str(named) if named else None


def session_of(request: Any) -> str | None:
    """The session a request belongs to, if it names one."""
    return _named_session(_xargs(request), request)


class SessionBook:
    """What the plugin remembers across a session's calls: its first arrival, and the
    engine time each live request has been scheduled for and its ``CallView``."""

    def __init__(self) -> None:
        self._arrivals: OrderedDict[str, float] = OrderedDict()
        self.service_s: dict[str, float] = {}
        self.calls: dict[str, RequestCall] = {}

    def session_arrival(self, session_id: str, arrival_s: float) -> float:
        """The session's first arrival (``arrival_s`` if it is new)."""
        first = self._arrivals.get(session_id)
        if first is None:
            self._arrivals[session_id] = first = arrival_s
            if len(self._arrivals) > SESSION_MEMORY:
                self._arrivals.popitem(last=False)
        return first

    def forget_request(self, request_id: str) -> None:
        self.service_s.pop(request_id, None)
        self.calls.pop(request_id, None)

    def forget_session(self, session_id: str) -> None:
        """The session ended (the gateway said so)."""
        self._arrivals.pop(session_id, None)


class RequestCall:
    """One vLLM ``Request`` as a ``CallView``."""

    __slots__ = ("_book", "_xargs", "call_id", "request", "session_arrival_s", "session_id")

    def __init__(self, request: Any, book: SessionBook) -> None:
        self.request = request
        self._book = book
        self._xargs = _xargs(request)
        # Read once (a view lives as long as its request): policies ask for these at
        # every step (MARS's chunk compares call ids for every prefill).
        named = self._xargs.get(wire.CALL_ID)
        # The SDK's and the gateway's id of the call, when the gateway forwarded it.
        self.call_id: str = str(named) if named else str(request.request_id)
        self.session_id: str = _named_session(self._xargs, request) or self.call_id
        self.session_arrival_s: float = book.session_arrival(self.session_id, self.arrival_s)

    @property
    def turn(self) -> int:
        return int(self._xargs.get(wire.TURN, 0))

    @property
    def arrival_s(self) -> float:
        return float(self.request.arrival_time)

    @property
    def prompt_tokens(self) -> int:
        return int(self.request.num_prompt_tokens)

    @property
    def output_tokens(self) -> int:
        return int(self.request.num_output_tokens)

    @property
    def max_tokens(self) -> int:
        return int(self.request.max_tokens)

    @property
    def num_computed_tokens(self) -> int:
        return int(self.request.num_computed_tokens)

    @property
    def num_tokens(self) -> int:
        return int(self.request.num_tokens)

    @property
    def num_preemptions(self) -> int:
        return int(self.request.num_preemptions)

    @property
    def cached_tokens(self) -> int | None:
        # vLLM sets it at the request's first scheduling (-1 before).
        cached = int(getattr(self.request, "num_cached_tokens", -1))
        return cached if cached >= 0 else None

    @property
    def service_s(self) -> float:
        # Kept by vLLM's request id (the plugin counts steps by it), not the call id.
        return self._book.service_s.get(str(self.request.request_id), 0.0)

    @property
    def follows_tool(self) -> bool:
        return bool(self._xargs.get(wire.FOLLOWS_TOOL, False))

    @property
    def expects_tool(self) -> bool:
        return bool(self._xargs.get(wire.EXPECTS_TOOL, False))

    @property
    def next_tool(self) -> str | None:
        tool = self._xargs.get(wire.NEXT_TOOL)
        return str(tool) if tool else None

    @property
    def expected_tool_s(self) -> float | None:
        seconds = self._xargs.get(wire.EXPECTED_TOOL_S)
        return float(seconds) if isinstance(seconds, int | float) else None

    @property
    def agent(self) -> str:
        return str(self._xargs.get(wire.AGENT, ""))

    @property
    def task_id(self) -> str:
        task = self._xargs.get(wire.TASK_ID)
        return str(task) if task else self.session_id


class RequestCalls(Sequence["CallView"]):
    """One of vLLM's request queues as calls, each view made when it is read: a
    policy that asks only how many there are, or stops at the first it looks for,
    makes none (a list of all of them at every ask cost a MARS step a few percent
    of stock vLLM's ``schedule()``, bench_schedule). Live: it reads the queue as it
    is when it is read."""

    __slots__ = ("_requests", "_view")

    def __init__(self, requests: Sequence[Any], view: SchedulerView) -> None:
        self._requests = requests
        self._view = view

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[CallView]:
        call = self._view.call
        return (call(request) for request in self._requests)

    @overload
    def __getitem__(self, index: int) -> CallView: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[CallView]: ...
    def __getitem__(self, index: int | slice) -> CallView | Sequence[CallView]:
        if isinstance(index, slice):
            return [self._view.call(request) for request in list(self._requests)[index]]
        return self._view.call(self._requests[index])


class SchedulerView(FollowsTools):
    """A vLLM scheduler's state as an ``EngineView``, read when a policy asks.

    The plugin sees the engine, and the CPU side only through the gateway's side
    channel: active and queued tools and tool durations follow the events it sends in
    (``tools``; zero without it), tool cores are unknown (0). ``active_sessions``
    counts the sessions with a call in the engine or a pin. The CPU KV tier's figures
    are the agentmars CPU tier's (``cpu_tier``), in vLLM blocks; 0 without one.
    The cost estimates are the ``AGENTMARS_PROFILE``'s (a policy that needs them is
    refused at start without one)."""

    def __init__(
        self,
        scheduler: Any,
        pins: PinTable,
        book: SessionBook,
        costs: CostEstimator | None = None,
        cpu_tier: Any = None,
    ) -> None:
        self._scheduler = scheduler
        self._cpu_tier = cpu_tier
        """``cpu_tier.offload.CpuTier`` (a vLLM-side object: not typed here)."""
        self._pins = pins
        self._book = book
        self._costs = costs
        self.tools = ToolActivity()
        self.decode_steps = 0
        """Steps that decoded at least one request (``EngineView.decode_steps``,
        counted by the plugin's ``update_from_output``)."""
        self.decode_time_s = 0.0
        """Their summed wall time, schedule to output."""
        # Fixed for the engine's life; read at almost every decision.
        self.block_size: int = int(scheduler.block_size)
        block_pool = scheduler.kv_cache_manager.block_pool
        # Block 0 is vLLM's null block, never allocated.
        self.total_blocks: int = int(block_pool.num_gpu_blocks) - 1
        # The pool's count of free blocks, read where its get_num_free_blocks() reads
        # it: one call fewer at each of the decisions that ask.
        self._free_queue = block_pool.free_block_queue
        # Each request's blocks in the first (full-attention) KV group, by request id:
        # vLLM's own record, read without building a KVCacheBlocks for each.
        self._held = scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks

    def call(self, request: Any) -> RequestCall:
        # One view per live request, kept until it finishes (its fields are read live):
        # building views was most of the cost of ordering the waiting queue at every
        # step (bench_schedule).
        call = self._book.calls.get(request.request_id)
        if call is None or call.request is not request:
            call = self._book.calls[request.request_id] = RequestCall(request, self._book)
        return call

    @property
    def now(self) -> float:
        # vLLM stamps arrival_time with the wall clock (time.time()).
        return time.time()

    @property
    def free_blocks(self) -> int:
        return int(self._free_queue.num_free_blocks)

    @property
    def pinned_blocks(self) -> int:
        return self._pins.pinned_blocks

    @property
    def cpu_total_blocks(self) -> int:
        tier = self._cpu_tier
        return 0 if tier is None else int(tier.total_blocks)

    @property
    def cpu_free_blocks(self) -> int:
        tier = self._cpu_tier
        return 0 if tier is None else int(tier.free_blocks)

    @property
    def max_num_seqs(self) -> int:
        return int(self._scheduler.max_num_running_reqs)

    @property
    def running(self) -> Sequence[CallView]:
        return RequestCalls(self._scheduler.running, self)

    @property
    def running_growth_blocks(self) -> int:
        return self.running_growth_up_to(sys.maxsize)

    def running_growth_up_to(self, blocks: int) -> int:
        # Read from vLLM's requests and block record themselves: through the calls'
        # views it cost a MARS step a tenth of stock vLLM's schedule()
        # (bench_schedule), and MARS asks for it at almost every step, where the
        # free blocks, its cap, are few.
        size, held = self.block_size, self._held
        growth = 0
        for request in self._scheduler.running:
            need = -(-(request.num_prompt_tokens + request.max_tokens) // size)
            need -= len(held.get(request.request_id, ()))
            if need > 0:
                growth += need
                if growth >= blocks:
                    return blocks
        return growth

    @property
    def waiting(self) -> Sequence[CallView]:
        return RequestCalls(self._scheduler.waiting, self)

    @property
    def pins(self) -> Sequence[Pin]:
        return list(self._pins.pins.values())

    def pin_of(self, session_id: str) -> Pin | None:
        return self._pins.pins.get(session_id)

    @property
    def active_sessions(self) -> int:
        requests = [*self._scheduler.running, *self._scheduler.waiting]
        sessions = {self.call(request).session_id for request in requests}
        return len(sessions | set(self._pins.pins))

    @property
    def tool_cores(self) -> int:
        return 0

    @property
    def has_costs(self) -> bool:
        return self._costs is not None

    @property
    def costs(self) -> CostEstimator:
        # Only policies that need Capability.COSTS ask, and those are refused at start
        # without a profile.
        assert self._costs is not None, "a policy asked for costs it did not declare or check"
        return self._costs

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)
