"""`ledger stream lag --checkpoint DIR`: a streaming query's lag per stream, as Kafka's consumer-group lag.

From the query's checkpoint (its last committed batch: connector/checkpoint.py) and the streams' heads
(connector/lag.py): the committed offset, the latest offset, and the rows and bytes between them. Bytes come
from ledger metadata (whole ledgers' lengths; a share of the ledger the query is in; the average bytes per
offset where no length is known, marked `~`). Only the newest checkpoint files and the head and newest
ledgers of each stream are read, so the command costs the same however long the query and streams have run.
"""
from __future__ import annotations

import json
import sys

from connector.checkpoint import Checkpoint, SourceOffset, read_checkpoint
from connector.commands.arguments import default_password, password
from connector.commands.command_client import open_client
from connector.lag import Lag, bytes_text, stream_lag
from metadata import streams
from metadata.errors import LedgerError
from metadata.model import recreated_since


class NoLedgerSourceError(LedgerError):
    """The checkpoint's query reads no ledger stream that this command can name."""


class StreamRecreatedError(LedgerError):
    """The checkpoint's offsets are of a stream deleted and created again since under the same name."""


def register_lag(command) -> None:
    """Adds `lag` to the `ledger stream` group; command(name, help, func) makes a subcommand with the group's
    common arguments (--metadata, security, --json)."""
    lag = command("lag", "a streaming query's lag per stream: committed and latest offsets, rows and bytes behind",
                  run_lag)
    lag.add_argument("--checkpoint", required=True, metavar="DIR",
                     help="the query's checkpointLocation (a local path or a file: URI)")
    lag.add_argument("--stream", metavar="NAME",
                     help="the stream of a source whose checkpointed offset does not name it (checkpoints written "
                          "before the source's offsets named their stream)")
    lag.add_argument("--password", type=password, default=default_password(),
                     help="the streams' ledger password (to read an OPEN tail's LAC)")


def run_lag(args) -> int:
    checkpoint = read_checkpoint(args.checkpoint)
    sources = _ledger_sources(checkpoint, args.stream)
    with open_client(args) as client:
        for source in sources:
            _check_incarnation(client, checkpoint, source)
        lags = [(source, stream_lag(client, source.stream, _committed(checkpoint, source),
                                    args.password)) for source in sources]
    if args.json:
        for source, lag in lags:
            print(json.dumps(_as_json(checkpoint, source, lag)))
    else:
        print(_table(checkpoint, lags))
    return 0


def _ledger_sources(checkpoint: Checkpoint, stream: str | None) -> list[SourceOffset]:
    """The sources of the newest batch (committed, else planned) that read a ledger stream, each with its stream."""
    found = checkpoint.committed or checkpoint.planned
    if not found:
        raise NoLedgerSourceError(
            f"checkpoint {checkpoint.path!r}: the query has planned no batch yet, so no source has an offset there")
    sources = []
    for source in found:
        if source.offset is None:
            continue  # another data source, or one with no offset yet
        if source.stream is None and stream is None:
            raise NoLedgerSourceError(
                f"checkpoint {checkpoint.path!r}: the offset of source {source.source} does not name its stream "
                "(the checkpoint was written before offsets named it); give it with --stream NAME")
        sources.append(SourceOffset(source.source, source.stream or stream, source.offset, source.created))
    if not sources:
        raise NoLedgerSourceError(f"checkpoint {checkpoint.path!r}: the query reads no ledger stream")
    return sources


def _check_incarnation(client, checkpoint: Checkpoint, source: SourceOffset) -> None:
    """A lag against a stream created again since the checkpoint would compare offsets of two different streams."""
    created = streams.read_stream(client.store, source.stream).value.created_at
    if recreated_since(source.created, created):
        raise StreamRecreatedError(
            f"checkpoint {checkpoint.path!r}: its offsets are of stream {source.stream!r} as it was before it was "
            "deleted and created again (its offsets started again at 0): the query's next batch fails with data "
            "loss (failOnDataLoss), and its lag against the new stream means nothing; give the query a new "
            "checkpointLocation to read the new stream from its start")


def _committed(checkpoint: Checkpoint, source: SourceOffset) -> int | None:
    """The source's offset in the last committed batch (None before the first commit)."""
    return source.offset if checkpoint.committed_batch is not None else None


def _planned(checkpoint: Checkpoint, source: SourceOffset) -> int | None:
    """The end of the batch planned after the last committed one, if one is (it is running, or died)."""
    for planned in checkpoint.planned:
        if planned.source == source.source:
            return planned.offset
    return None


def _as_json(checkpoint: Checkpoint, source: SourceOffset, lag: Lag) -> dict:
    return dict(lag.as_json(), source=source.source, batch=checkpoint.committed_batch,
                planned_batch=checkpoint.planned_batch, planned_offset=_planned(checkpoint, source))


def _table(checkpoint: Checkpoint, lags: list[tuple[SourceOffset, Lag]]) -> str:
    if checkpoint.committed_batch is None:
        head = f"no batch committed yet (batch {checkpoint.planned_batch} planned)"
    else:
        head = f"last committed batch {checkpoint.committed_batch}"
        if checkpoint.planned_batch is not None:
            head += f" (batch {checkpoint.planned_batch} planned, not committed)"
    lines = [f"checkpoint {checkpoint.path}: {head}",
             f"{'stream':<24}  {'committed':>12}  {'latest':>12}  {'rows behind':>12}  {'bytes behind':>16}"]
    for _, lag in lags:
        committed = "-" if lag.committed_offset is None else str(lag.committed_offset)
        rows = "-" if lag.rows_behind is None else f"{lag.rows_behind:,}"
        size = "-" if lag.committed_offset is None else _bytes_cell(lag)
        lines.append(f"{lag.stream:<24}  {committed:>12}  {lag.latest_offset:>12}  {rows:>12}  {size:>16}")
    for _, lag in lags:
        if lag.rows_gone:
            print(f"ledger: warning: {lag.describe()}", file=sys.stderr)
    if any(lag.estimated_offsets for _, lag in lags):
        lines.append("~ bytes partly estimated (the average bytes per offset of the ledgers read; see --json "
                     "estimated_offsets)")
    return "\n".join(lines)


def _bytes_cell(lag: Lag) -> str:
    text = bytes_text(lag)
    return "unknown" if lag.bytes_behind is None else text.removesuffix(" bytes")
