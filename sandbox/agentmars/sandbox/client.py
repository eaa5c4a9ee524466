"""Python client of the sandbox service (``agentmars sandbox serve``).

A call carries the W3C trace context of its session (``traceparent``): its tool call's
or its session's span when the current agentmars session's emitter traces it (an
``OTelSink``), else the current OpenTelemetry span's; the service's span of the call
is its child."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self

import httpx
from opentelemetry import propagate

from agentmars.sandbox.spec import ExecResult, ExecSpec, SandboxError
from agentmars.sdk.auth import check_token
from agentmars.sdk.session import current_session

StreamCallback = Callable[[str, str], None]
"""Receives (stream name, text chunk) while a streamed call runs."""


class SandboxClientError(SandboxError):
    """The service refused the request (``status_code`` and its message) or could not
    be reached (``status_code`` None)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        detail = response.text
    return detail if isinstance(detail, str) else json.dumps(detail)


class SandboxClient:
    """Blocking client; one per thread or shared (httpx.Client is thread-safe).

    ``timeout_s`` bounds connecting and each read; a call's own time limit is the
    spec's ``timeout_s``, so reads wait that long plus ``timeout_s``.
    """

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 10.0) -> None:
        check_token(token)
        self.base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SandboxClientError(
                f"sandbox service at {self.base_url} failed during {method} {path}: {exc!r}"
            ) from exc
        if response.status_code >= 400:
            raise SandboxClientError(_detail(response), response.status_code)
        return response

    def health(self) -> dict[str, Any]:
        return dict(self._request("GET", "/healthz").json())

    def open_session(self, session_id: str) -> str:
        """Create the session's workspace; returns its path on the host."""
        body = self._request("POST", "/v1/sessions", json={"session_id": session_id}).json()
        return str(body["workspace"])

    def close_session(self, session_id: str, *, keep_workspace: bool = False) -> None:
        params = {"keep_workspace": str(keep_workspace).lower()}
        self._request("DELETE", f"/v1/sessions/{session_id}", params=params)

    def run(
        self,
        session_id: str,
        spec: ExecSpec,
        *,
        tool: str = "tool",
        priority: int = 0,
        call_id: str | None = None,
        turn: int | None = None,
    ) -> ExecResult:
        body = self._exec_body(spec, tool, priority, call_id, turn, stream=False)
        response = self._request(
            "POST",
            f"/v1/sessions/{session_id}/exec",
            json=body,
            headers=_trace_headers(session_id, call_id),
            timeout=self._call_timeout(spec),
        )
        return ExecResult.model_validate(response.json())

    def run_streaming(
        self,
        session_id: str,
        spec: ExecSpec,
        on_output: StreamCallback,
        *,
        tool: str = "tool",
        priority: int = 0,
        call_id: str | None = None,
        turn: int | None = None,
    ) -> ExecResult:
        body = self._exec_body(spec, tool, priority, call_id, turn, stream=True)
        path = f"/v1/sessions/{session_id}/exec"
        headers = _trace_headers(session_id, call_id)
        timeout = self._call_timeout(spec)
        try:
            with self._http.stream("POST", path, json=body, headers=headers, timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    raise SandboxClientError(_detail(r), r.status_code)
                return _read_stream(r.iter_lines(), on_output)
        except httpx.HTTPError as exc:
            raise SandboxClientError(
                f"sandbox service at {self.base_url} failed during a streamed call: {exc!r}"
            ) from exc

    def interrupt(self, session_id: str, call_id: str) -> bool:
        path = f"/v1/sessions/{session_id}/calls/{call_id}/interrupt"
        return bool(self._request("POST", path).json()["interrupted"])

    def _call_timeout(self, spec: ExecSpec) -> httpx.Timeout:
        # The service's default limit is unknown here: allow a day when none is set.
        limit = spec.timeout_s if spec.timeout_s is not None else 24 * 3600.0
        return httpx.Timeout(self._timeout_s, read=limit + self._timeout_s)

    @staticmethod
    def _exec_body(
        spec: ExecSpec,
        tool: str,
        priority: int,
        call_id: str | None,
        turn: int | None,
        stream: bool,
    ) -> dict[str, Any]:
        extra = {"tool": tool, "priority": priority, "call_id": call_id, "turn": turn}
        return {
            **spec.model_dump(exclude_none=True),
            **{k: v for k, v in extra.items() if v is not None},
            "stream": stream,
        }


def _trace_headers(session_id: str, call_id: str | None) -> dict[str, str]:
    """The trace context a call of ``session_id`` carries (module docstring)."""
    session = current_session()
    if session is not None and session.session_id == session_id:
        headers = session.emitter.trace_headers(session_id, call_id)
    else:
        headers = {}
    if headers:
        return headers
    current: dict[str, str] = {}
    propagate.inject(current)
    return current


def _read_stream(lines: Iterator[str], on_output: StreamCallback) -> ExecResult:
    for line in lines:
        if not line:
            continue
        message = json.loads(line)
        if "result" in message:
            return ExecResult.model_validate(message["result"])
        if "error" in message:
            raise SandboxClientError(message["error"], 400)
        on_output(message["stream"], message["data"])
    raise SandboxClientError("the sandbox service closed the stream before the result")
