"""Lost replies from ZooKeeper, for real: a chosen request is sent to the real ZooKeeper and applied there, then
the caller sees what a dropped connection gives it (MetadataError caused by ConnectionLoss), so the store's own
retries and read-backs run unchanged. The injection sits at the store's one door to ZooKeeper
(MetadataStore._translate); `meanwhile` runs between the apply and the error: what other sessions do while the
caller reconnects."""
from __future__ import annotations

from typing import Callable

from kazoo.exceptions import ConnectionLoss

from metadata.errors import MetadataError
from metadata.store import MetadataStore


def describe(fn, args) -> tuple[str, str]:
    """(operation, path) of a kazoo call as _translate is given it; a multi's path lists its operations."""
    name = getattr(fn, "__name__", repr(fn))
    owner = getattr(fn, "__self__", None)
    if name == "commit" and owner is not None and hasattr(owner, "operations"):
        return "multi", " ".join(f"{type(op).__name__}:{getattr(op, 'path', '')}" for op in owner.operations)
    return name, str(args[0]) if args else ""


class LostReplies:
    """Loses the reply of the next `times` requests that match(operation, path, kwargs), after they are applied."""

    def __init__(self, monkeypatch, match: Callable[[str, str, dict], bool], meanwhile: Callable[[], None] = lambda: None,
                 times: int = 1):
        self.match, self.meanwhile, self.left = match, meanwhile, times
        self.lost: list[tuple[str, str]] = []
        real = MetadataStore._translate

        def _translate(store, fn, *args, **kwargs):
            operation, path = describe(fn, args)
            armed = self.left > 0 and self.match(operation, path, kwargs)
            result = real(store, fn, *args, **kwargs)    # applied by ZooKeeper
            if not armed:
                return result
            self.left -= 1
            self.lost.append((operation, path))
            self.meanwhile()
            raise MetadataError(f"ZooKeeper request failed: ConnectionLoss (a test lost the reply of {operation} "
                                f"{path}, which was applied)") from ConnectionLoss()

        monkeypatch.setattr(MetadataStore, "_translate", _translate)
