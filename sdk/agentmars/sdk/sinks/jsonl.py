"""JSONL file sink: one event per line, each line written whole."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agentmars.sdk.events import Event


class JsonlSink:
    """Appends events to ``path``. Each line goes out in one ``write`` under a lock,
    so concurrent sessions never interleave partial lines; ``flush_every`` bounds
    how many events a crash can lose (1 = flush every event)."""

    def __init__(self, path: str | os.PathLike[str], *, flush_every: int = 1) -> None:
        if flush_every < 1:
            raise ValueError("flush_every must be >= 1")
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"JSONL sink path {self.path} is a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._flush_every = flush_every
        self._pending = 0
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        line = event.to_json() + "\n"
        with self._lock:
            if self._file.closed:
                raise ValueError(f"JSONL sink {self.path} is closed")
            self._file.write(line)
            self._pending += 1
            if self._pending >= self._flush_every:
                self._file.flush()
                self._pending = 0

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()
