"""`python -m storage_node --data-dir D --port P --metadata URI --node-id ID [...]` (see config.py)."""
from __future__ import annotations

import asyncio
import logging
import sys

from metadata.errors import LedgerError
from protos.heap import keep_large_buffers_on_heap
from storage_node.config import parse_config
from storage_node.node import serve

LOG_FORMAT = "%(asctime)s %(levelname)s node={node_id} %(name)s: %(message)s"


def configure_logging(node_id: str, level: str) -> None:
    """Every line on stderr, each naming the node (several nodes may log into one journal or terminal),
    Python warnings included. kazoo reports every connection attempt at INFO; from it only WARNING and up
    (a lost connection)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT.format(node_id=node_id.replace("%", "%%"))))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("kazoo").setLevel(max(logging.getLevelName(level), logging.WARNING))
    logging.captureWarnings(True)


def main(argv: list[str] | None = None) -> int:
    # The two exits below are the process's own one-line answer on stderr (like argparse's usage errors),
    # not log lines: the first comes before there is a node id to log with, and a refusal is the whole of
    # what an operator (or `ledger cluster start`, which quotes it) needs to read.
    try:
        config = parse_config(argv)
    except LedgerError as exc:
        print(f"storage node: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.node_id, config.log_level)
    keep_large_buffers_on_heap()
    try:
        return asyncio.run(serve(config))
    except LedgerError as exc:
        print(f"storage node {config.node_id} refuses to start: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
