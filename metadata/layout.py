"""Znode paths under the metadata root (the chroot of the metadata URI).

    /layout                     the marker `ledger init` writes once the directories below exist: the layout
                                version and the cluster's instance id (BookKeeper's LAYOUT and INSTANCEID). A
                                client or node refuses a root without it (metadata/store.py)
    /ledgers/L0000000042        ledger metadata (persistent)
    /idgen/id-0000000042        ledger id allocation (ephemeral sequential, removed at once)
    /streams/<name>             stream heads: format, schema, owner, batch write outcomes, first offset, and
                                the tail (the most recent ledgers); see metadata/streams.py
    /streams/<name>/queries/<query id>
                                the last micro-batch a streaming query committed to the stream, set in the
                                multi that commits it (metadata/query_commits.py)
    /streams/<name>/books/K-F-P a book of the stream's sealed pages: its K-th, holding the pages from offset F
                                up to the next book's F; P the highest ledger id in the stream's pages when it
                                was created (metadata/streams.py)
    /streams/<name>/books/K-F-P/F-L-M
                                a sealed page: closed ledgers covering offsets F..L, M the highest ledger id in
                                it; immutable, created in the multi that takes them off the tail
    /streams/<name>/books/K-F-P/F-L-M-G
                                a page of generation G, rewritten by a compaction (the page it replaces stays
                                for the compaction's grace period)
    /streams/<name>/pages/F-L-M[-G]
                                a flat page, as software before books sealed them: read, never created again
    /streams/<name>/cuts/<id>   a truncation or retention run's cut: planned, then (in the multi that moves the
                                stream's first offset) the ledgers it took off the tail; deleted once they are
                                (connector/retention.py)
    /nodes/<node id>            storage node registration (ephemeral)
    /cookies/<node id>          storage node cookies (persistent)
    /writers/<writer id>        writer liveness (ephemeral)
    /decommissioned/<node id>   retired storage nodes: placement skips them, audit moves data off them
    /readonly/<node id>         operator's read-only flag (persistent): the node refuses normal adds
    /spark-jobs/<job id>        a Spark batch write in progress; its version goes up once the job ends
    /spark-jobs/<job id>/L0000000042
                                a task ledger of the job, registered before the ledger is created
    /spark-queries/<query id>/L0000000042-B7
                                a task ledger of micro-batch 7 of a streaming query, registered the same way
                                (task registries: see connector/spark/jobs.py)
    /compactions/<stream>@<id>  a compaction of a stream in progress: the ledgers it replaces, its state; the
                                ledgers it creates are registered under it as a task's are (L0000000042)
"""
from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse

from metadata.model import StreamBook, StreamPage

LEDGERS = "/ledgers"
IDGEN = "/idgen"
STREAMS = "/streams"
NODES = "/nodes"
COOKIES = "/cookies"
WRITERS = "/writers"
DECOMMISSIONED = "/decommissioned"
READONLY = "/readonly"
SPARK_JOBS = "/spark-jobs"
SPARK_QUERIES = "/spark-queries"
COMPACTIONS = "/compactions"
ALL_DIRS = (
    LEDGERS, IDGEN, STREAMS, NODES, COOKIES, WRITERS, DECOMMISSIONED, READONLY, SPARK_JOBS, SPARK_QUERIES, COMPACTIONS,
)
MARKER = "/layout"
# Features a cluster turns on once every client that could break them runs a version that keeps them (a znode
# each; `ledger init` creates them on a new root, `ledger init --enable FEATURE` on an existing one).
FEATURES = "/features"
# Storage nodes drop their over-replicated copies (storage_node/gc.py): safe only once every auditor and
# `ledger decommission` checks a ledger's copy_drops in its re-replication's compare-and-set.
COPY_DROPS = f"{FEATURES}/copy-drops"
KNOWN_FEATURES = {"copy-drops": COPY_DROPS}
# Names that become one znode each (streams, storage node ids): no '/', no '.' or '..', nothing ZooKeeper or a
# file system (a node's directory in a local cluster) reads specially.
NAME_RULE = "1-200 letters, digits, '_', '.' or '-', starting with a letter or digit"
NODE_ID_RULE = ("1-200 bytes (UTF-8), no '/' nor control character (as ZooKeeper takes names), not '.' or '..', not "
                "starting with '-'")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
# Only what ZooKeeper (a path component) or a local cluster's directory cannot take: ids that nodes ran under before
# this check (host:port as BookKeeper's bookies, node@rack, ...) keep working.
_NOT_IN_ZNODE_NAMES = "/\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\U0010ffff"   # ZooKeeper's path check, and '/'
_NODE_ID = re.compile(rf"(?!\.\.?\Z)[^\-{_NOT_IN_ZNODE_NAMES}][^{_NOT_IN_ZNODE_NAMES}]*")   # not '-' first: a flag
NODE_ID_BYTES = 200   # in UTF-8, with room for what a local cluster adds to it in a file name (".log")
# The layout ALL_DIRS describes. A root whose marker records an older version gets the directories added since
# (and its marker rewritten) by the next store that opens it; a newer version is refused.
LAYOUT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class LayoutMarker:
    """What /layout holds: written once by `ledger init`, read by every store that opens the root."""

    version: int
    instance_id: str
    initialised_at: float

    def encode(self) -> bytes:
        return json.dumps({"layout_version": self.version, "instance_id": self.instance_id,
                           "initialised_at": self.initialised_at}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "LayoutMarker | None":
        """None if data is not a marker record (damaged, or something else's znode)."""
        try:
            raw = json.loads(data.decode())
            return cls(int(raw["layout_version"]), str(raw["instance_id"]), float(raw["initialised_at"]))
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
            return None


def is_name(name: object) -> bool:
    """name follows NAME_RULE: it is safe as one znode's name (a stream's)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def is_node_id(node_id: object) -> bool:
    """node_id follows NODE_ID_RULE: it is safe as one znode's name and a local cluster's file and directory name."""
    return isinstance(node_id, str) and _NODE_ID.fullmatch(node_id) is not None and \
        len(node_id.encode("utf-8", "surrogatepass")) <= NODE_ID_BYTES


def ledger_path(ledger_id: int) -> str:
    return f"{LEDGERS}/L{ledger_id:010d}"


def ledger_id_from_name(name: str) -> int:
    return int(name[1:])


def stream_path(name: str) -> str:
    return f"{STREAMS}/{name}"


def stream_pages_path(name: str) -> str:
    return f"{STREAMS}/{name}/pages"


def stream_books_path(name: str) -> str:
    return f"{STREAMS}/{name}/books"


def stream_book_path(name: str, book: StreamBook) -> str:
    return f"{stream_books_path(name)}/{book_name(book)}"


def stream_page_path(name: str, page: StreamPage) -> str:
    """A page's znode: in its book, or directly under /pages for a flat page."""
    return f"{STREAMS}/{name}/{page_ref(page)}" if page.book else f"{stream_pages_path(name)}/{page_name(page)}"


def page_ref(page: StreamPage) -> str:
    """How a compaction's record names a page it replaced: a flat page by its name (under /pages, as older
    records do), a page in a book by its path under the stream's head (books/K-F-P/F-L-M-G)."""
    if page.book is None:
        return page_name(page)
    return f"books/{book_name(page.book)}/{page_name(page)}"


def page_ref_path(name: str, ref: str) -> str:
    """The znode of a page a compaction's record names (page_ref)."""
    return f"{STREAMS}/{name}/{ref}" if "/" in ref else f"{stream_pages_path(name)}/{ref}"


def stream_queries_path(name: str) -> str:
    return f"{STREAMS}/{name}/queries"


def stream_query_path(name: str, query_id: str) -> str:
    """The znode of query_id's last committed batch; the id is quoted (a znode name holds no '/' and is not '.'
    or '..')."""
    return f"{stream_queries_path(name)}/{urllib.parse.quote(query_id, safe='').replace('.', '%2E')}"


def query_id_from_name(name: str) -> str:
    return urllib.parse.unquote(name)


def stream_cuts_path(name: str) -> str:
    return f"{STREAMS}/{name}/cuts"


def stream_compaction_mark_path(name: str) -> str:
    """Where the stream's next compaction plan starts (connector/compaction.py plan_start)."""
    return f"{STREAMS}/{name}/compaction-mark"


def stream_cut_path(name: str, cut_id: str) -> str:
    return f"{stream_cuts_path(name)}/{cut_id}"


def page_name(page: StreamPage) -> str:
    """F-L-M for a page sealed off the tail, F-L-M-G for a page of generation G (rewritten by a compaction)."""
    generation = f"-{page.generation}" if page.generation else ""
    return f"{page.first_offset}-{page.last_offset}-{page.max_ledger_id}{generation}"


_PAGE_NAME = re.compile(r"^(\d+)-(-?\d+)-(\d+)(?:-(\d+))?$")


def page_from_name(page_name: str, book: StreamBook | None = None) -> StreamPage:
    """The page a name says (in `book`, None: a flat page). A page of empty ledgers only (a stream writer
    opened and closed without an append leaves one) ends one offset before it starts: at offset 0 its name
    is 0--1-M."""
    found = _PAGE_NAME.match(page_name)
    if found is None:
        raise ValueError(f"{page_name!r} is not a stream page's name (F-L-M or F-L-M-G)")
    first, last, max_id, generation = (None if part is None else int(part) for part in found.groups())
    return StreamPage(first, last, max_id, generation or 0, book)


def book_name(book: StreamBook) -> str:
    """K-F-P: its ordinal, its first offset, the highest ledger id in the stream's pages before it (-1: none)."""
    return f"{book.ordinal}-{book.first_offset}-{book.max_ledger_id}"


_BOOK_NAME = re.compile(r"^(\d+)-(\d+)-(-1|\d+)$")


def book_from_name(name: str) -> StreamBook:
    found = _BOOK_NAME.match(name)
    if found is None:
        raise ValueError(f"{name!r} is not a stream book's name (K-F-P)")
    return StreamBook(*(int(part) for part in found.groups()))


def compaction_path(compaction_id: str) -> str:
    return f"{COMPACTIONS}/{compaction_id}"


def node_path(node_id: str) -> str:
    return f"{NODES}/{node_id}"


def cookie_path(node_id: str) -> str:
    return f"{COOKIES}/{node_id}"


def writer_path(writer_id: str) -> str:
    return f"{WRITERS}/{writer_id}"


def decommissioned_path(node_id: str) -> str:
    return f"{DECOMMISSIONED}/{node_id}"


def readonly_path(node_id: str) -> str:
    return f"{READONLY}/{node_id}"
