"""The Virtual Token Counter (Sheng et al., OSDI'24): fair sharing of the engine
between clients by the service they received (notes/baselines.md "VTC")."""

from __future__ import annotations

from collections import defaultdict

from agentmars.sdk.events import AnyEvent, LLMEnd, SessionEnd
from agentmars.server.policies.interface import EngineHalf, Policy, SortKey
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView


@register
class VTC(Policy):
    """VTC: serve the backlogged client with the least virtual service first.

    Each client u has a counter c_u, raised by ``w_p`` per prompt token when one of its
    calls is admitted and by ``w_q`` per generated token. When a client becomes
    backlogged (a call of it waits and none did before), c_u is lifted to the least
    counter of the other backlogged clients, so idleness earns no credit. Waiting calls
    are served by their client's counter, FCFS within a client. Variant: the client is
    the agent session, as in seed 004's use of VTC; counters are brought up to date at
    each step, and generated tokens are counted as the engine reports them. NOTE: ours —
    clients that became backlogged since the last step are lifted one by one in the
    order their calls arrived, each against the ones before it too, as the paper's
    per-arrival update would; a call that ran and ended between two steps that looked
    at the counters is charged in full when it ends."""

    name = "vtc"
    variant = "VTC paper (OSDI'24), w_p = 1, w_q = 2, client = session (seed 004)"

    def __init__(self, w_prompt: float = 1.0, w_output: float = 2.0) -> None:
        if w_prompt < 0 or w_output < 0:
            raise ValueError("weights must be non-negative")
        self.w_prompt = w_prompt
        self.w_output = w_output

    def settings(self) -> dict[str, float]:
        return {"w_prompt": self.w_prompt, "w_output": self.w_output}

    def engine(self) -> VTCEngine:
        return VTCEngine(self.w_prompt, self.w_output)


class VTCEngine(EngineHalf):
    """VTC's counters and order inside the engine (``VTC``'s docstring)."""

    def __init__(self, w_prompt: float, w_output: float) -> None:
        self.w_prompt = w_prompt
        self.w_output = w_output
        self.counters: dict[str, float] = defaultdict(float)
        self._charged: dict[tuple[str, str], int] = {}
        """Calls charged so far: (session id, call id) -> output tokens charged."""
        self._backlogged: set[str] = set()
        self._updated_at: float | None = None

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, LLMEnd):
            self._charge_end(event)
        elif isinstance(event, SessionEnd):
            self.counters.pop(event.session_id, None)

    def _charge_end(self, end: LLMEnd) -> None:
        """Charge the rest of a finished call: its output since the last update, or all
        of it, prompt included, if no update saw it running."""
        charged = self._charged.pop((end.session_id, end.call_id), None)
        if charged is None:
            charged = 0
            self.counters[end.session_id] += self.w_prompt * (end.prompt_tokens or 0)
        self.counters[end.session_id] += self.w_output * ((end.output_tokens or 0) - charged)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        if self._updated_at != view.now:
            self._update(view)
        return (self.counters[call.session_id],)

    def _update(self, view: EngineView) -> None:
        self._updated_at = view.now
        for call in view.running:
            key = (call.session_id, call.call_id)
            charged = self._charged.get(key)
            if charged is None:
                charged = 0
                self.counters[call.session_id] += self.w_prompt * call.prompt_tokens
            self.counters[call.session_id] += self.w_output * (call.output_tokens - charged)
            self._charged[key] = call.output_tokens
        self._lift_newcomers(view)

    def _lift_newcomers(self, view: EngineView) -> None:
        first_wait: dict[str, float] = {}
        for call in view.waiting:
            first_wait[call.session_id] = min(
                call.arrival_s, first_wait.get(call.session_id, call.arrival_s)
            )
        backlogged = set(first_wait)
        lifted = backlogged & self._backlogged
        newcomers = [client for client in first_wait if client not in self._backlogged]
        for client in sorted(newcomers, key=first_wait.__getitem__):
            if lifted:
                floor = min(self.counters[other] for other in lifted)
                self.counters[client] = max(self.counters[client], floor)
            lifted.add(client)
        self._backlogged = backlogged
