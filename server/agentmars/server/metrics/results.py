"""``results.json``: what a sweep (``agentmars sim run`` / ``sweep``) leaves behind and
the report is drawn from. One ``RunResult`` per (workload, arrival rate, policy) run:
its summary and the load it ran at; the sweep's resolved configuration rides along so
the report can show it. Schema: ``docs/metrics.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic_core import ErrorDetails

from agentmars.server.metrics.summary import RunSummary

_FROZEN = ConfigDict(frozen=True, extra="forbid")

PREDICTED = " (sim)"
"""Suffix of a run that is the simulator's prediction of the run of the policy it
follows (``agentmars bench replay`` and ``agentmars demo``: ``mars (sim)`` beside
``mars``)."""


def is_prediction(policy: str) -> bool:
    return policy.endswith(PREDICTED)


def prediction_error(predicted: float, measured: float) -> float:
    """How far the prediction was off, relative to the measured figure (+0.1: 10 % too
    high)."""
    return predicted / measured - 1


class RunResult(BaseModel):
    """One run of one policy on one workload at one load."""

    model_config = _FROZEN

    rate: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """Arrival rate (sessions per second) of an open-loop run; None for closed loop."""
    summary: RunSummary

    @property
    def workload(self) -> str:
        return self.summary.workload

    @property
    def policy(self) -> str:
        return self.summary.policy


class SweepResult(BaseModel):
    """The contents of ``results.json``."""

    model_config = _FROZEN

    version: Literal[1] = 1
    config: dict[str, JsonValue] = Field(default_factory=dict)
    """The sweep's resolved configuration (shown as is in the report)."""
    runs: list[RunResult]

    def write(self, path: Path) -> None:
        """Write as indented JSON, creating the parent folder."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> SweepResult:
        """Read ``path``; a missing file or bad content raises ``ValueError`` naming the
        file and the offending fields."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ValueError(f"{path}: cannot read: {error.strerror}") from error
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            problems = "; ".join(_describe(problem) for problem in error.errors()[:5])
            raise ValueError(f"{path}: not a valid results file: {problems}") from error


def _describe(problem: ErrorDetails) -> str:
    """``runs.0.rate: Input should be greater than 0`` (the field, then what is wrong)."""
    field = ".".join(str(part) for part in problem["loc"])
    return f"{field}: {problem['msg']}" if field else problem["msg"]
