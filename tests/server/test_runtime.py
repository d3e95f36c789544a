"""The server's asynchronous machinery (perseus.server.runtime): job rows, coalesced loads."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fastapi.testclient import TestClient

from perseus.core.errors import JobNotFound
from perseus.server.runtime import Coalescer
from perseus.server.settings import Settings

from .conftest import create_job


def test_cached_jobs_are_evicted(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"cached_jobs": 16}))
    jobs = [create_job(client) for _ in range(40)]
    heads = client.app.state.perseus.heads  # type: ignore[attr-defined]
    assert heads.cached <= 16
    assert jobs[0].view()["state"] == "registering"  # read again from the database


# ----------------------------------------------------------------------------- coalesced loads


def test_concurrent_loads_of_one_key_run_once_and_later_ones_run_again() -> None:
    calls: list[str] = []

    async def main() -> None:
        coalescer = Coalescer()
        gate = asyncio.Event()

        def loader(key: str) -> Callable[[], Awaitable[str]]:
            async def load() -> str:
                calls.append(key)
                await gate.wait()
                return f"{key}{len(calls)}"

            return load

        waiting = [asyncio.ensure_future(coalescer.run("k", loader("k"))) for _ in range(5)]
        other = asyncio.ensure_future(coalescer.run("other", loader("other")))
        await asyncio.sleep(0)
        gate.set()
        assert set(await asyncio.gather(*waiting)) == {"k1"}
        assert await other == "other2"
        assert await coalescer.run("k", loader("k")) == "k3"  # nothing kept once done

    asyncio.run(main())
    assert calls == ["k", "other", "k"]


def test_a_caller_giving_up_does_not_cancel_the_load_for_the_others() -> None:
    async def main() -> None:
        coalescer = Coalescer()
        gate = asyncio.Event()

        async def load() -> int:
            await gate.wait()
            return 42

        first = asyncio.ensure_future(coalescer.run("k", load))
        second = asyncio.ensure_future(coalescer.run("k", load))
        await asyncio.sleep(0)
        first.cancel()  # a client that disconnected
        gate.set()
        assert await second == 42
        assert first.cancelled()

    asyncio.run(main())


def test_a_failed_load_fails_every_caller_and_the_next_one_tries_again() -> None:
    async def main() -> None:
        coalescer = Coalescer()
        attempts: list[int] = []

        async def load() -> int:
            attempts.append(1)
            await asyncio.sleep(0)
            if len(attempts) == 1:
                raise JobNotFound("gone")
            return 1

        results = await asyncio.gather(
            coalescer.run("k", load), coalescer.run("k", load), return_exceptions=True
        )
        assert [type(r) for r in results] == [JobNotFound, JobNotFound]
        assert await coalescer.run("k", load) == 1

    asyncio.run(main())
