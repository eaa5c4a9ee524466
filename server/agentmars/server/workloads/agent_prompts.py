"""Seed 004's task-parallel agents with their input prompts: the agents of the
``task-parallel`` and ``elephant-mice`` workloads, and the training and test data of
Justitia's per-agent-type cost predictor (§4.2), all drawn by ``draw_agent``.

``draw_agent`` draws an agent's detail instruction (``DETAIL``), then its sessions
(``task_parallel.agent_sessions``: the class's fan-out, stages and token sizes, the
outputs scaled by the instruction's factor), then writes its input text from the
draw; every session of the agent carries the text as ``SessionSpec.input_text``. A
predictor sample is ``(agent class, the agent's input text, its KV token-time)``:
the cost is the sum of the agent's inferences' ``p*d + d^2/2`` (§4.1,
``workloads.kv_cost``), and as the text is written from the draw, what the
input names is what the agent will do:

- one numbered item per branch where the branches are items of the input (the
  claims of EV, FV, CC, the questions of KBQAV, the sections of MRS), each as long
  as its branch's own prompt tokens (``ITEM_WORDS`` words at the class's median);
- the number of branches written out where they are copies (CG's candidates, SC's
  reasoning paths, DM's candidate merges);
- one step per stage where the stages are steps (PE's plan); an ALFWorld room
  (ALFWI) lists about as many receptacles as the episode takes steps
  (``RECEPTACLE_SD``), the one channel here that is noisy by construction;
- a detail instruction that sets how long the outputs are (``DETAIL``).

The draw's lognormal output lengths and own-prompt sizes the text does not show
stay the noise a predictor cannot learn, as run-to-run variance is in the paper
(Appendix A: demand is stable per agent, not fixed).

Seed 004's: the classes, the cost, the idea that an agent's input carries its
demand. Ours: all the text (templates, word lists), ``DETAIL`` and the mapping from
draw to text. The words are filler, not a topic model: the predictor can only
learn from the structure above. Which class stands for which task (CC as a
consistency check, KBQAV as knowledge-base question answering with verification)
is our reading of the abbreviations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from agentmars.server.workloads.kv_cost import agent_cost
from agentmars.server.workloads.model import SessionSpec
from agentmars.server.workloads.task_parallel import (
    AGENT_CLASSES,
    QWEN25_32B_CONTEXT,
    SIZE_SHARES,
    AgentClass,
    agent_sessions,
)

AGENT_TYPES = tuple(agent.name for agent in AGENT_CLASSES)
ITEM_WORDS = 20
"""Words of an item whose branch has the class's median own prompt: an abridged
rendering (MRS's sections are ~2,400 tokens each) that keeps the texts short
enough for TF-IDF to cost well under a millisecond, and the items' lengths
proportional to their token sizes."""
PASSAGE_WORDS = 60
"""Median words of the shared input (evidence, a problem, documents): it is the
same size for every agent of a class in ``task_parallel``, so its length here is
drawn apart from the cost (sigma 0.3) and tells the predictor nothing."""
RECEPTACLE_SD = 2.0
DETAIL = {
    "Keep every answer short.": 0.6,
    "": 1.0,
    "Explain your reasoning in detail.": 1 / 0.6,
}
"""Instruction -> factor on the class's median output tokens, drawn uniformly; the
factors' geometric mean is 1, so the classes' typical sizes stay
``task_parallel``'s."""


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


NOUNS = words(
    "treaty bridge vaccine river company reactor festival library senate glacier "
    "startup museum harbour railway council satellite drought election orchestra "
    "hospital refinery archive telescope province vineyard airline stadium canal "
    "factory university"
)
VERBS = words(
    "approved expanded reported doubled replaced funded delayed closed opened "
    "measured rejected restored acquired launched documented"
)
ADJECTIVES = words(
    "regional national early annual public private northern coastal historic modern "
    "rural federal independent"
)
PLACES = words("Lisbon Nairobi Osaka Quebec Tallinn Lima Perth Bergen Accra Cordoba Hanoi Dresden")
RECEPTACLES = words(
    "cabinet drawer countertop shelf fridge microwave sinkbasin stoveburner "
    "coffeemachine garbagecan sidetable dresser"
)
ALFWORLD_GOALS = (
    "put a clean mug in coffeemachine",
    "heat some egg and put it in garbagecan",
    "cool some apple and put it in countertop",
    "look at bowl under the desklamp",
    "put two cellphone in sofa",
    "find some knife and put it in drawer",
)
MODEL_TOOLS = (
    "transcribe the audio clip",
    "detect the objects in the photo",
    "caption the image",
    "translate the transcript into French",
    "answer the question about the chart",
    "summarise the web page",
    "classify the sentiment of the review",
    "generate an image of the scene",
    "read the text in the scanned form",
    "segment the people in the video frame",
)
SECTIONS = words(
    "Introduction Background Methods Market Risks Operations Finance Outlook Governance Appendix"
)
LANGUAGES = ("Python", "Java", "C++", "Go", "Rust")


@dataclass(frozen=True)
class AgentSample:
    agent: str
    """The agent's class (``task_parallel.AGENT_CLASSES``): Justitia's agent type."""
    prompt: str
    """The agent's input, as its user gives it."""
    cost: float
    """The agent's KV token-time, summed over all its inferences (seed 004 Eq. 1)."""


def agent_samples(agent: str, count: int, seed: int) -> list[AgentSample]:
    """``count`` agents of class ``agent``; the same for the same seed."""
    if agent not in AGENT_TYPES:
        raise ValueError(f"unknown agent class {agent!r}; known: {', '.join(AGENT_TYPES)}")
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    rng = np.random.default_rng((seed, AGENT_TYPES.index(agent)))
    return [draw_sample(AGENT_CLASSES[AGENT_TYPES.index(agent)], rng) for _ in range(count)]


def sample_mix(per_type: int, seed: int) -> list[AgentSample]:
    """``per_type`` agents of every class, class by class."""
    return [sample for agent in AGENT_TYPES for sample in agent_samples(agent, per_type, seed)]


def draw_sample(agent: AgentClass, rng: np.random.Generator) -> AgentSample:
    """One agent of class ``agent`` as the workloads draw it, with its input and cost."""
    sessions = draw_agent(agent, rng, agent.name, QWEN25_32B_CONTEXT)
    return AgentSample(agent.name, sessions[0].input_text or "", sessions_cost(sessions))


def draw_agent(
    agent: AgentClass, rng: np.random.Generator, instance: str, max_context: int
) -> list[SessionSpec]:
    """One agent of class ``agent``: its branches' sessions (named
    ``<instance>.<branch>``, ``agent`` the class's name), each with the agent's input
    text. The detail instruction is drawn first, then the sessions, then the text."""
    detail = str(rng.choice(list(DETAIL)))
    factor = DETAIL[detail]
    sized = dataclasses.replace(
        agent, output=agent.output * factor, reduce_output=agent.reduce_output * factor
    )
    sessions = agent_sessions(sized, rng, instance, max_context)
    header, body = RENDERERS[agent.name](agent, sessions, rng)
    prompt = "\n".join(part for part in (header, detail, body) if part)
    return [session.model_copy(update={"input_text": prompt}) for session in sessions]


def task_parallel_agents(
    rng: np.random.Generator, count: int, max_context: int, prefix: str
) -> list[list[SessionSpec]]:
    """The ``task-parallel`` workload (seed 004 §5.1): ``count`` agents of the size mix
    (``task_parallel.SIZE_SHARES``, a class uniformly within its size), each the list
    of its branches' sessions, instances ``<prefix>-00000``, ``<prefix>-00001``, ..."""
    sizes = rng.choice(list(SIZE_SHARES), count, p=list(SIZE_SHARES.values())).tolist()
    agents = []
    for i, size in enumerate(sizes):
        members = [c for c in AGENT_CLASSES if c.size == size]
        agent = members[int(rng.integers(len(members)))]
        agents.append(draw_agent(agent, rng, f"{prefix}-{i:05d}", max_context))
    return agents


ELEPHANT = "MRS"
MICE = ("KBQAV", "CC", "ALFWI")
"""Seed 004 §5.3's starvation experiment: one large "elephant" agent (MapReduce
Summarization), then "mice" drawn at random from these small classes."""


def elephant_mice_agents(
    rng: np.random.Generator, count: int, max_context: int, prefix: str
) -> list[list[SessionSpec]]:
    """The ``elephant-mice`` workload (seed 004 §5.3): agent 0 is an MRS agent, the
    other ``count - 1`` are each drawn uniformly from ``MICE``; instances named as in
    ``task_parallel_agents``. Their arrivals are ``elephant_mice_times``. Each agent is
    drawn whole before the next, so a workload with more mice has the same elephant
    and begins with the same mice (Fig. 9 compares counts of mice)."""
    by_name = {agent.name: agent for agent in AGENT_CLASSES}
    agents = [draw_agent(by_name[ELEPHANT], rng, f"{prefix}-00000", max_context)]
    for i in range(1, count):
        mouse = by_name[MICE[int(rng.integers(len(MICE)))]]
        agents.append(draw_agent(mouse, rng, f"{prefix}-{i:05d}", max_context))
    return agents


def elephant_mice_times(rng: np.random.Generator, rate: float, count: int) -> list[float]:
    """The elephant at 0 and mouse ``i`` at ``i / rate`` (seed 004 §5.3: "once per
    second" is ``rate`` 1); deterministic, ``rng`` unused."""
    return [i / rate for i in range(count)]


def sessions_cost(sessions: Sequence[SessionSpec]) -> float:
    return agent_cost(
        (session.prompt_tokens(i), turn.output_tokens)
        for session in sessions
        for i, turn in enumerate(session.turns)
    )


# --- text -------------------------------------------------------------------


def prose(rng: np.random.Generator, words: int) -> str:
    """Sentences of filler about ``words`` words long (at least one word)."""
    out: list[str] = []
    while len(out) < max(1, words):
        out += sentence(rng).split()
    return " ".join(out[: max(1, words)]).rstrip(".") + "."


def sentence(rng: np.random.Generator) -> str:
    def pick(words: Sequence[str]) -> str:
        return words[int(rng.integers(len(words)))]

    year = int(rng.integers(1890, 2024))
    return (
        f"The {pick(ADJECTIVES)} {pick(NOUNS)} {pick(VERBS)} the {pick(NOUNS)} "
        f"near {pick(PLACES)} in {year}."
    )


def passage(rng: np.random.Generator) -> str:
    return prose(rng, round(PASSAGE_WORDS * rng.lognormal(0.0, 0.3)))


def own_tokens(agent: AgentClass, session: SessionSpec) -> int:
    """A branch's first-prompt tokens beyond the agent's shared input (not
    ``shared_prefix_tokens``: that is 0 for an agent of one branch)."""
    return max(0, session.turns[0].append_tokens - round(agent.prompt * agent.shared))


def item_words(agent: AgentClass, session: SessionSpec) -> int:
    median = agent.prompt * (1 - agent.shared)
    return max(3, round(ITEM_WORDS * own_tokens(agent, session) / median))


def numbered(label: str, texts: Sequence[str]) -> str:
    return "\n".join(f"{label} {i}: {text}" for i, text in enumerate(texts, 1))


def branch_items(
    label: str, agent: AgentClass, sessions: Sequence[SessionSpec], rng: np.random.Generator
) -> str:
    """One numbered item per branch, each as long as the branch's own prompt."""
    return numbered(label, [prose(rng, item_words(agent, session)) for session in sessions])


# --- one renderer per class: (header, body) ----------------------------------

Renderer = Callable[[AgentClass, Sequence[SessionSpec], np.random.Generator], tuple[str, str]]


def itemised(header: str, source: str, item: str) -> Renderer:
    """A class whose input is a passage and one item per branch (a claim verified, a
    question answered per call: EV, FV, CC, KBQAV)."""

    def render(
        agent: AgentClass, sessions: Sequence[SessionSpec], rng: np.random.Generator
    ) -> tuple[str, str]:
        return header, f"{source}: {passage(rng)}\n{branch_items(item, agent, sessions, rng)}"

    return render


render_ev = itemised(
    "Verify each claim below against the evidence. Answer SUPPORTED or REFUTED.",
    "Evidence",
    "Claim",
)
render_fv = itemised(
    "For each claim, write search queries, then judge the claim on what they return.",
    "Context",
    "Claim",
)
render_cc = itemised(
    "Check whether each statement is consistent with the source text.", "Source", "Statement"
)
render_kbqav = itemised(
    "Answer each question from the knowledge base, then verify the answer.",
    "Knowledge base",
    "Question",
)


def render_alfwi(
    agent: AgentClass, sessions: Sequence[SessionSpec], rng: np.random.Generator
) -> tuple[str, str]:
    """An episode takes more steps in a room with more places to search."""
    steps = len(sessions[0].turns)
    count = max(2, round(steps + rng.normal(0.0, RECEPTACLE_SD)))
    kinds: list[str] = rng.choice(RECEPTACLES, count).tolist()
    seen = ", ".join(f"a {kind} {kinds[: i + 1].count(kind)}" for i, kind in enumerate(kinds))
    goal = ALFWORLD_GOALS[int(rng.integers(len(ALFWORLD_GOALS)))]
    room = f"You are in the middle of a room. Looking quickly around you, you see {seen}."
    return "Interact with the household to solve the task.", f"{room}\nYour task is to: {goal}."


def render_cg(
    agent: AgentClass, sessions: Sequence[SessionSpec], rng: np.random.Generator
) -> tuple[str, str]:
    language = LANGUAGES[int(rng.integers(len(LANGUAGES)))]
    header = f"Write {len(sessions)} candidate {language} programs that solve the problem below."
    return header, f"Problem: {passage(rng)}"


def render_pe(
    agent: AgentClass, sessions: Sequence[SessionSpec], rng: np.random.Generator
) -> tuple[str, str]:
    """One model-tool step of the request per stage of the plan."""
    steps = rng.choice(MODEL_TOOLS, len(sessions[0].turns)).tolist()
    plan = numbered("Step", steps)
    header = "Plan and carry out this request with the available model tools."
    return header, f"{prose(rng, item_words(agent, sessions[0]))}\n{plan}"


def render_sc(
    agent: AgentClass, sessions: Sequence[SessionSpec], rng: np.random.Generator
) -> tuple[str, str]:
    header = f"Sample {len(sessions)} independent reasoning paths and return the majority answer."
    return header, f"Problem: {passage(rng)}"


def render_dm(
    agent: AgentClass, sessions: Sequence[SessionSpec], rng: np.random.Generator
) -> tuple[str, str]:
    header = f"Propose {len(sessions)} candidate merges of the documents below and score each."
    documents = [passage(rng) for _ in range(int(rng.integers(2, 6)))]
    return header, numbered("Document", documents)


def render_mrs(
    agent: AgentClass, sessions: Sequence[SessionSpec], rng: np.random.Generator
) -> tuple[str, str]:
    header = "Summarise the report below section by section, then merge the summaries."
    sessions = [session for session in sessions if not session.after]  # the maps, not the reduce
    titles = rng.choice(SECTIONS, len(sessions)).tolist()
    texts = [
        f"{title}. {prose(rng, item_words(agent, session))}"
        for title, session in zip(titles, sessions, strict=True)
    ]
    return header, numbered("Section", texts)


RENDERERS: dict[str, Renderer] = {
    "EV": render_ev,
    "FV": render_fv,
    "CC": render_cc,
    "ALFWI": render_alfwi,
    "KBQAV": render_kbqav,
    "CG": render_cg,
    "PE": render_pe,
    "SC": render_sc,
    "DM": render_dm,
    "MRS": render_mrs,
}
