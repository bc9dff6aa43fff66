"""The real transport, observed: the calls in flight and made per (node, method), and the requests sent. Tests act
while calls are in flight, or count where a client's calls went; the transport is never replaced."""
from __future__ import annotations

import collections

from connector.client import LedgerClient
from connector.client.transport import GrpcTransport


class ObservedTransport(GrpcTransport):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight: collections.Counter = collections.Counter()   # (node, method) -> calls in flight
        self.made: collections.Counter = collections.Counter()        # (node, method) -> calls made
        self.requests: list[tuple[str, str, object]] = []             # (node, method, request) of every call

    def _observe(self, node, method, request) -> None:
        self.in_flight[node, method] += 1
        self.made[node, method] += 1
        self.requests.append((node, method, request))

    async def _unary(self, node, method, request, timeout):
        self._observe(node, method, request)
        try:
            return await super()._unary(node, method, request, timeout)
        finally:
            self.in_flight[node, method] -= 1

    async def read_range(self, node, request, timeout):
        self._observe(node, "ReadRange", request)
        try:
            async for response in super().read_range(node, request, timeout):
                yield response
        finally:
            self.in_flight[node, "ReadRange"] -= 1


class ObservedClient(LedgerClient):
    def transport(self) -> GrpcTransport:
        return ObservedTransport(self.store, self.tls, self.auth_token, self.node_addresses)


def observed(client: LedgerClient) -> ObservedTransport:
    return client._ctx.transport
