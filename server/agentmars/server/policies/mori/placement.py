"""Who moves between tiers, in what order (seed 003 §4.3.1). Pure functions over the
candidates' figures, so each rule can be checked by hand (tests/server/policies/mori).

Sticky placement: nothing moves while the GPU tier fits; demotion only when its
programs' contexts exceed the GPU KV, promotion only into room that is free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentmars.server.policies.mori.tiers import Tier


@dataclass(frozen=True, slots=True)
class Candidate:
    session_id: str
    tokens: int
    idleness: float
    reasoning: bool = False
    tier: Tier = Tier.GPU
    blocks: int = 0
    """KV blocks its context takes (what it needs in the CPU tier)."""


@dataclass(frozen=True, slots=True)
class Demotion:
    session_id: str
    to: Tier
    lazy: bool
    """A Reasoning program: it moves when its call ends."""


def demotions(gpu: Sequence[Candidate], excess_tokens: int, cpu_free_blocks: int) -> list[Demotion]:
    """Demote GPU-tier programs until ``excess_tokens`` are gone: Acting before
    Reasoning, the most idle first within each; each to the CPU tier while its blocks
    fit there, else to Waiting."""
    order = sorted(gpu, key=lambda c: (c.reasoning, -c.idleness, c.session_id))
    moves = []
    for candidate in order:
        if excess_tokens <= 0:
            break
        excess_tokens -= candidate.tokens
        to = Tier.CPU if candidate.blocks <= cpu_free_blocks else Tier.WAITING
        if to is Tier.CPU:
            cpu_free_blocks -= candidate.blocks
        moves.append(Demotion(candidate.session_id, to, lazy=candidate.reasoning))
    return moves


def promotions(
    waiting: Sequence[Candidate],
    room_tokens: int,
    residents: Sequence[Candidate] = (),
    cpu_free_blocks: int = 0,
) -> tuple[list[str], list[Demotion]]:
    """Promote gated programs whose call waits: CPU-tier ones before Waiting ones (new
    programs come after both, at the gateway), the least idle first within each, each
    that can be placed (one that cannot waits for the next tick; NOTE: ours — §4.3.1
    gives the order, not what a misfit does; stopping there instead would hold every
    smaller program behind a large one).

    A program is placed into the free room, or else in the place of GPU-tier
    ``residents`` (Acting programs) more idle than it, the most idle first, if they
    free enough: the mismatch §4.3 resolves, an idle program holding HBM while a busier
    one waits on the CPU or in Waiting. Those are demoted (to the CPU tier while their
    blocks fit there, else to Waiting); returns the promoted programs and these
    demotions."""
    order = sorted(waiting, key=lambda c: (c.tier is Tier.WAITING, c.idleness, c.session_id))
    movable = sorted(residents, key=lambda c: (-c.idleness, c.session_id))
    moved: list[str] = []
    demoted: list[Demotion] = []
    for candidate in order:
        if candidate.tokens > room_tokens:
            freed, victims = room_tokens, []
            for resident in movable:
                if freed >= candidate.tokens or resident.idleness <= candidate.idleness:
                    break
                victims.append(resident)
                freed += resident.tokens
            if freed < candidate.tokens:
                continue
            for victim in victims:
                movable.remove(victim)
                to = Tier.CPU if victim.blocks <= cpu_free_blocks else Tier.WAITING
                if to is Tier.CPU:
                    cpu_free_blocks -= victim.blocks
                demoted.append(Demotion(victim.session_id, to, lazy=False))
            room_tokens = freed
        room_tokens -= candidate.tokens
        if candidate.tier is Tier.CPU:
            cpu_free_blocks += candidate.blocks
        moved.append(candidate.session_id)
    return moved, demoted
