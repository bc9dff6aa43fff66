"""The soak's history: one JSON object per line, one file per actor, merged in time order at the end.

A record is {"t": invoke time, "t_end": completion time, "actor", "op", "outcome", ...op fields}; outcome is
ok (acknowledged), failed (refused before anything was sent: it did not happen) or unknown (it may or may
not have happened: a fenced add, a lost reply, a timeout). Lines are flushed one by one, so a SIGKILLed
actor leaves at most a torn last line, which reading skips.

Payloads describe themselves, `actor|ledger|entry|size|` followed by filler derived from those fields, so
the checker can judge every entry it finds in a ledger, also one whose append was never recorded (its
writer was killed before it could write the line): the entry must sit where its payload says it was sent.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import time
from typing import Iterable, Iterator

OK = "ok"
FAILED = "failed"
UNKNOWN = "unknown"
OUTCOMES = (OK, FAILED, UNKNOWN)


def payload(actor: str, ledger_id: int, entry_id: int, size: int) -> bytes:
    """The payload `actor` sends as entry `entry_id` of ledger `ledger_id`: at least its header, else size bytes."""
    header = f"{actor}|{ledger_id}|{entry_id}|{size}|".encode()
    return header + hashlib.shake_128(header).digest(max(0, size - len(header)))


def parse_payload(data: bytes) -> tuple[str, int, int] | None:
    """(actor, ledger id, entry id) a payload was sent as, or None if it is not a payload the soak wrote."""
    try:
        actor, ledger_id, entry_id, size, _ = data.split(b"|", 4)
        expected = payload(actor.decode(), int(ledger_id), int(entry_id), int(size))
    except (ValueError, UnicodeDecodeError):
        return None
    return (actor.decode(), int(ledger_id), int(entry_id)) if data == expected else None


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class HistoryWriter:
    """Appends one actor's records to its own file, a line at a time."""

    def __init__(self, path: str | os.PathLike, actor: str):
        self.path = pathlib.Path(path)
        self.actor = actor
        self._file = open(self.path, "a", buffering=1)
        if self._torn():
            # The actor's last process was killed mid-line: its next record must not be glued to that torn line,
            # which makes both undecodable (read_records skips the torn line alone).
            self._file.write("\n")

    def _torn(self) -> bool:
        """Whether the file ends in the middle of a line."""
        with open(self.path, "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"

    def record(self, op: str, outcome: str, t: float, **fields) -> dict:
        """Write one operation invoked at `t` (time.time()) that completed now, or at fields['t_end']."""
        assert outcome in OUTCOMES, outcome
        entry = {"t": round(t, 4), "t_end": round(fields.pop("t_end", time.time()), 4), "actor": self.actor,
                 "op": op, "outcome": outcome, **fields}
        self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
        return entry

    def close(self) -> None:
        self._file.close()


def read_records(path: str | os.PathLike) -> Iterator[dict]:
    """Records of one file; a torn or undecodable line (an actor killed mid-write) is skipped."""
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "op" in record:
                yield record


def merge(paths: Iterable[str | os.PathLike], out: str | os.PathLike) -> list[dict]:
    """All records of all files in invocation order, also written to `out` as one JSON-lines history."""
    records = sorted((r for p in paths for r in read_records(p)), key=lambda r: (r["t"], r["actor"]))
    with open(out, "w") as f:
        for record in records:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
    return records
