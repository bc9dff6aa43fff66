"""`python -m storage_node --data-dir D --port P --metadata URI --node-id ID [...]` (see config.py)."""
from __future__ import annotations

import asyncio
import sys

from metadata.errors import LedgerError
from storage_node.config import parse_config
from storage_node.memory import keep_large_buffers_on_heap
from storage_node.node import serve


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except LedgerError as exc:
        print(f"storage node: {exc}", file=sys.stderr)
        return 2
    keep_large_buffers_on_heap()
    try:
        return asyncio.run(serve(config))
    except LedgerError as exc:
        print(f"storage node {config.node_id} refuses to start: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
