"""A stream that waits long for the model stays alive: SSE comments while no event comes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from app.server.jobs import with_heartbeats


def test_a_silent_stream_gets_comments_until_its_event_comes() -> None:
    released = asyncio.Event()
    closed: list[bool] = []

    async def events() -> AsyncIterator[str]:
        try:
            await released.wait()  # the model's first token, after a long prefill
            yield "data: 1\n\n"
        finally:
            closed.append(True)

    async def read() -> list[str]:
        out = []
        async for event in with_heartbeats(events(), every_s=0.01):
            out.append(event)
            if len(out) == 3:
                released.set()
        return out

    out = asyncio.run(read())
    assert out[:3] == [": waiting for the model\n\n"] * 3
    assert out[-1] == "data: 1\n\n"
    assert closed == [True]


def test_leaving_a_waiting_stream_closes_its_events() -> None:
    closed: list[bool] = []

    async def events() -> AsyncIterator[str]:
        try:
            await asyncio.Event().wait()  # never comes
            yield "data: never\n\n"
        finally:
            closed.append(True)  # (the job's cancel is set here in the routes' streams)

    async def leave_after_one_comment() -> None:
        stream = with_heartbeats(events(), every_s=0.01)
        assert (await anext(stream)).startswith(":")
        await stream.aclose()

    asyncio.run(leave_after_one_comment())
    assert closed == [True]
