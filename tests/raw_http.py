"""Raw HTTP/1.1 on a socket, for tests of what a server does with a client no library
would be: chunked bodies that never end, headers sent a byte at a time."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

PIECE = b" " * 65536
"""One chunk of body: JSON whitespace, so the body stays valid JSON as far as it goes."""


@contextlib.contextmanager
def connected(url: str) -> Iterator[socket.socket]:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        yield sock


def head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", *headers, "", ""]
    return "\r\n".join(lines).encode()


def response_of(sock: socket.socket) -> tuple[int, dict[str, Any], http.client.HTTPResponse]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, json.loads(response.read()), response


def send_chunked_until_answered(sock: socket.socket, total: int) -> int:
    """Send ``total`` bytes of chunked body, stopping early once the server answers
    or hangs up; returns how many were sent."""
    sent = 0
    while sent < total:
        if select.select([sock], [], [], 0)[0]:
            break
        try:
            sock.sendall(b"%x\r\n%s\r\n" % (len(PIECE), PIECE))
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(PIECE)
    return sent


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closes the connection (whatever it sends before), False if
    it keeps it open for the socket's timeout."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True
