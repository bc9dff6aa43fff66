"""What the runners share: the network, the metadata store, the deadlines, and how a blocking metadata call
is made (a worker thread; the deterministic simulator runs it on its own virtual clock instead)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Awaitable, Callable, Iterable

from connector.client.errors import LedgerError
from connector.client.ops.read import DEFAULT_SPECULATIVE_READ_TIMEOUT
from connector.client.placement import Quarantine
from connector.client.schedule import Schedule
from connector.client.transport import Transport
from metadata import registry
from metadata.model import LedgerMetadata
from metadata.store import MetadataStore

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Context:
    store: MetadataStore
    transport: Transport
    timeout: float       # for one read answer, or one fencing answer
    add_timeout: float   # an add a node has not acknowledged after this long counts as that node failing
    call_metadata: Callable[..., Awaitable[Any]] = asyncio.to_thread  # runs a blocking metadata call
    placement: Callable[[MetadataStore], registry.Placement] = registry.placement
    # a read asks another replica as well when its node has not answered for this long (0: never)
    speculative_timeout: float = DEFAULT_SPECULATIVE_READ_TIMEOUT
    # nodes that failed a read, or kept one waiting past speculative_timeout, recently: later reads ask them last
    read_failures: Quarantine = dataclasses.field(default_factory=Quarantine)

    async def metadata(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.call_metadata(fn, *args)

    async def nodes(self) -> registry.Placement:
        """The nodes a new fragment may use (not decommissioned), with the placement epoch to store it under."""
        return await self.call_metadata(self.placement, self.store)


def schedule_of(meta: LedgerMetadata) -> Schedule:
    return Schedule(meta.ensemble_size, meta.write_quorum, meta.ack_quorum)


async def until_done(op, coroutines: list[Awaitable[None]], within: float | None = None) -> None:
    """Run the calls concurrently until op.done (or for at most within seconds), then cancel what is still waiting
    (a frozen node)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    loop = asyncio.get_running_loop()
    deadline = None if within is None else loop.time() + within
    try:
        pending = set(tasks)
        while pending and not op.done:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(tasks)


async def cancel_and_wait(tasks: Iterable[asyncio.Future]) -> None:
    """Cancel the calls a runner no longer needs and wait until they have ended: a cancelled call still holds its
    gRPC stream and what it received until it has run its cleanup, which would outlive the read that made it. The
    calls' outcomes are taken here (asyncio would log an error no one took as never retrieved); an error that is
    not a node's failure, a bug, is logged."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for outcome in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(outcome, Exception) and not isinstance(outcome, LedgerError):
            log.error("a cancelled call had failed", exc_info=outcome)
