"""A job's output, one stream at a time, capped at ``Job.output_cap_bytes``: the one
capper both backends read their jobs' output into, so that results and streams end
the same way whichever backend ran the job."""

from __future__ import annotations

import logging

from agentmars.sandbox.backends.base import OutputCallback, Stream
from agentmars.sandbox.spec import TRUNCATION_MARKER

log = logging.getLogger(__name__)


class CappedOutput:
    """One stream: the first ``cap`` bytes kept, the rest read and counted, never
    buffered (each chunk is dropped once counted, however much the job writes). The
    kept part of each chunk goes on to ``on_output`` as it arrives, and ``finish``
    sends the truncation marker after it, so a listener receives exactly what ``text``
    returns. Fed from one thread at a time (the docker backend's reader thread, the
    process backend's event loop), read once the feeding has ended."""

    def __init__(self, stream: Stream, cap: int, on_output: OutputCallback | None = None) -> None:
        self.stream = stream
        self.cap = cap
        self.dropped = 0
        """Bytes past the cap: read (the job never blocks on a full pipe) and dropped."""
        self._kept = bytearray()
        self._text: str | None = None
        self._on_output = on_output

    def feed(self, chunk: bytes) -> None:
        """Keep what still fits of ``chunk`` and pass that part on; count the rest."""
        kept = chunk[: max(self.cap - len(self._kept), 0)]
        self._kept += kept
        self.dropped += len(chunk) - len(kept)
        if kept:
            self._forward(kept)

    def finish(self) -> None:
        """Pass the truncation marker on, if anything was dropped: the stream has ended."""
        if self.truncated:
            self._forward(self.marker.encode())

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    @property
    def marker(self) -> str:
        return TRUNCATION_MARKER.format(dropped=self.dropped) if self.truncated else ""

    def text(self) -> str:
        """The stream as ``ExecResult`` shows it: the kept bytes (a character the cap
        cut in two is replaced), then the marker. Made once, when the feeding has
        ended, and the kept bytes let go: at no time are there more than the kept
        bytes and their text (no third copy to add the marker)."""
        if self._text is None:
            kept, self._kept = self._kept, bytearray()
            # The marker starts with a newline: decoded along, it leaves a cut
            # character's replacement as decoding the kept bytes alone would.
            kept += self.marker.encode()
            self._text = kept.decode("utf-8", errors="replace")
        return self._text

    def _forward(self, chunk: bytes) -> None:
        if self._on_output is not None:
            deliver(self._on_output, self.stream, chunk)


def deliver(on_output: OutputCallback, stream: Stream, chunk: bytes) -> None:
    """Hand ``chunk`` to ``on_output``; what it raises is logged, not passed on: a
    broken listener must not lose the job's output."""
    try:
        on_output(stream, chunk)
    except Exception:
        log.exception("on_output callback failed")
