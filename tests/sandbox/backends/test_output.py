"""The output capper both backends read a job's stdout and stderr into."""

from __future__ import annotations

import logging

import pytest

from agentmars.sandbox.backends.base import Stream
from agentmars.sandbox.backends.output import CappedOutput
from agentmars.sandbox.spec import TRUNCATION_MARKER


def _listened(cap: int) -> tuple[CappedOutput, list[tuple[Stream, bytes]]]:
    seen: list[tuple[Stream, bytes]] = []
    return CappedOutput("stderr", cap, lambda s, d: seen.append((s, d))), seen


def test_keeps_the_first_bytes_and_counts_the_rest() -> None:
    out, seen = _listened(5)
    for chunk in (b"abc", b"defg", b"hij"):
        out.feed(chunk)
    assert (out.dropped, out.truncated) == (5, True)
    assert out.text() == "abcde" + TRUNCATION_MARKER.format(dropped=5)
    assert seen == [("stderr", b"abc"), ("stderr", b"de")]  # nothing once the cap is full


def test_output_within_the_cap_is_whole_and_unmarked() -> None:
    out, seen = _listened(5)
    out.feed(b"12345")
    out.finish()
    assert (out.text(), out.truncated, out.marker) == ("12345", False, "")
    assert seen == [("stderr", b"12345")]


def test_the_marker_is_streamed_last_so_the_stream_reads_as_the_text() -> None:
    out, seen = _listened(3)
    out.feed(b"x" * 10)
    out.feed(b"y" * 10)
    out.finish()
    assert b"".join(d for _, d in seen).decode() == out.text()
    assert seen[-1] == ("stderr", TRUNCATION_MARKER.format(dropped=17).encode())


def test_a_zero_cap_keeps_nothing_and_still_counts() -> None:
    out, seen = _listened(0)
    out.feed(b"xy")
    out.feed(b"")
    assert out.text() == TRUNCATION_MARKER.format(dropped=2)
    assert seen == []


def test_a_cap_inside_a_character_is_replaced_not_an_error() -> None:
    out = CappedOutput("stdout", 1)
    out.feed("é".encode())
    assert out.text().startswith("\ufffd")


def test_without_a_listener_it_only_keeps() -> None:
    out = CappedOutput("stdout", 4)
    out.feed(b"abcdef")
    out.finish()
    assert out.text() == "abcd" + TRUNCATION_MARKER.format(dropped=2)


def test_a_broken_listener_is_logged_and_loses_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def broken(stream: Stream, data: bytes) -> None:
        raise RuntimeError("listener bug")

    out = CappedOutput("stdout", 4, broken)
    with caplog.at_level(logging.ERROR):
        out.feed(b"ab")
        out.feed(b"cdef")
        out.finish()
    assert out.text() == "abcd" + TRUNCATION_MARKER.format(dropped=2)
    assert caplog.text.count("on_output callback failed") == 3
