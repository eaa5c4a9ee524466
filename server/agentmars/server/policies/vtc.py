"""The Virtual Token Counter (Sheng et al., OSDI'24): fair sharing of the engine
between clients by the service they received (notes/baselines.md "VTC")."""

from __future__ import annotations

from collections import defaultdict

from agentmars.sdk.events import AnyEvent, LLMEnd, SessionEnd, SessionStart
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
    the agent instance, as in seed 004's use of VTC ("the agent level", §5.1): the
    sessions of one task share a counter (``CallView.task_id``; a session without a
    task is its own client), so a fan-out agent's branches together get one fair
    share. Counters are brought up to date at each step, and generated tokens are
    counted as the engine reports them. NOTE: ours — clients that became backlogged
    since the last step are lifted one by one in the order their calls arrived, each
    against the ones before it too, as the paper's per-arrival update would; a call
    that ran and ended between two steps that looked at the counters is charged in
    full when it ends, to the instance its session is known to belong to (from its
    calls, or ``session_start``'s ``task_id`` metadata; else to the session, moved to
    the instance when that is learnt); a client's counter is dropped when the last of
    its sessions seen so far ends."""

    name = "vtc"
    variant = "VTC paper (OSDI'24), w_p = 1, w_q = 2, client = agent instance (seed 004)"

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
        """Client (agent instance) -> its virtual counter."""
        self._client_of: dict[str, str] = {}
        """Session id -> the client it belongs to, for the sessions seen so far."""
        self._sessions: dict[str, set[str]] = defaultdict(set)
        """Client -> its sessions seen so far that have not ended."""
        self._charged: dict[tuple[str, str], int] = {}
        """Calls charged so far: (session id, call id) -> output tokens charged."""
        self._backlogged: set[str] = set()
        self._updated_at: float | None = None

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, LLMEnd):
            self._charge_end(event)
        elif isinstance(event, SessionStart):
            task = event.metadata.get("task_id")
            if task:
                self._join(event.session_id, task)
        elif isinstance(event, SessionEnd):
            self._leave(event.session_id)

    def client(self, call: CallView) -> str:
        """The client ``call`` is served and charged as: its agent instance."""
        client = call.task_id or call.session_id
        if self._client_of.get(call.session_id) != client:
            self._join(call.session_id, client)
        return client

    def _join(self, session_id: str, client: str) -> None:
        previous = self._client_of.get(session_id)
        if previous == client:
            return
        self._client_of[session_id] = client
        self._sessions[client].add(session_id)
        if previous is not None:
            self._sessions[previous].discard(session_id)
        elif session_id != client and session_id in self.counters:
            # Charged to the session before its instance was known (a call that ran
            # between two looks): each token counts once, for the instance.
            self.counters[client] += self.counters.pop(session_id)

    def _leave(self, session_id: str) -> None:
        client = self._client_of.pop(session_id, session_id)
        sessions = self._sessions.get(client)
        if sessions is not None:
            sessions.discard(session_id)
            if sessions:
                return
            del self._sessions[client]
        self.counters.pop(client, None)

    def _charge_end(self, end: LLMEnd) -> None:
        """Charge the rest of a finished call: its output since the last update, or all
        of it, prompt included, if no update saw it running."""
        client = self._client_of.get(end.session_id, end.session_id)
        charged = self._charged.pop((end.session_id, end.call_id), None)
        if charged is None:
            charged = 0
            self.counters[client] += self.w_prompt * (end.prompt_tokens or 0)
        self.counters[client] += self.w_output * ((end.output_tokens or 0) - charged)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        if self._updated_at != view.now:
            self._update(view)
        return (self.counters[self.client(call)],)

    def _update(self, view: EngineView) -> None:
        self._updated_at = view.now
        for call in view.running:
            client = self.client(call)
            key = (call.session_id, call.call_id)
            charged = self._charged.get(key)
            if charged is None:
                charged = 0
                self.counters[client] += self.w_prompt * call.prompt_tokens
            self.counters[client] += self.w_output * (call.output_tokens - charged)
            self._charged[key] = call.output_tokens
        self._lift_newcomers(view)

    def _lift_newcomers(self, view: EngineView) -> None:
        first_wait: dict[str, float] = {}
        for call in view.waiting:
            client = self.client(call)
            first_wait[client] = min(call.arrival_s, first_wait.get(client, call.arrival_s))
        backlogged = set(first_wait)
        lifted = backlogged & self._backlogged
        newcomers = [client for client in first_wait if client not in self._backlogged]
        for client in sorted(newcomers, key=first_wait.__getitem__):
            if lifted:
                floor = min(self.counters[other] for other in lifted)
                self.counters[client] = max(self.counters[client], floor)
            lifted.add(client)
        self._backlogged = backlogged
