"""A writer appending pipelined entries on a thread, recording what was acknowledged, until an add fails."""
from __future__ import annotations

import threading

from connector.client import LedgerError


class BackgroundWriter:
    """Appends pipelined entries on a thread until an add fails; remembers every acknowledged entry."""

    def __init__(self, writer, window: int = 50):
        self.writer = writer
        self.acked: dict[int, bytes] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._window = window
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        n = 0
        in_flight = []
        try:
            while not self._stop.is_set():
                payload = b"payload-%d" % n
                in_flight.append((payload, self.writer.append_async(payload)))
                n += 1
                if len(in_flight) >= self._window:
                    payload, future = in_flight.pop(0)
                    self.acked[future.result(timeout=60)] = payload
            for payload, future in in_flight:
                self.acked[future.result(timeout=60)] = payload
        except LedgerError as exc:
            for payload, future in in_flight:  # adds that completed before the failure still count as acked
                if future.done() and future.exception() is None:
                    self.acked[future.result()] = payload
            self.error = exc

    def stop(self):
        self._stop.set()
        self._thread.join(60)
        return self
