"""connector/spark/spans.py batch_spans: a micro-batch's ledgers from the offsets latestOffset promised (rule 17),
from the stream record alone (no LAC read), reading ledger metadata only for arrow ledgers in the range."""
import pytest

from connector.spark.planning import LedgerPartition, LedgerSpan, ReadBounds, plan_partitions
from connector.spark.spans import batch_spans
from metadata.errors import LedgerError
from metadata.model import Fragment, LedgerMetadata, LedgerState, StreamLedger, StreamRecord, Versioned


class LedgerMetadataOnly:
    """Stands in for the metadata store: serves ledger metadata and records which ledgers were read."""

    def __init__(self, last_entries: dict[int, int], open_ids=()):
        self.last_entries = last_entries
        self.open_ids = set(open_ids)
        self.read: list[int] = []

    def read_ledger(self, ledger_id):
        self.read.append(ledger_id)
        state = LedgerState.OPEN if ledger_id in self.open_ids else LedgerState.CLOSED
        meta = LedgerMetadata(ledger_id, 3, 3, 2, (Fragment(0, ("a", "b", "c")),), state=state,
                              last_entry_id=self.last_entries.get(ledger_id, -1))
        return Versioned(meta, 0)


RAW = StreamRecord("events", format="raw", tail=(
    StreamLedger(1, 0, 99), StreamLedger(2, 100, 199), StreamLedger(3, 200)))   # 3: the OPEN tail


def test_the_open_tail_of_a_raw_stream_is_planned_up_to_the_promised_end():
    store = LedgerMetadataOnly({})
    spans, reach = batch_spans(store, RAW, 150, 449)
    assert spans == [LedgerSpan(2, 99, 100, 199), LedgerSpan(3, 249, 200, None)]
    assert reach is None   # the tail reaches any promised end
    assert store.read == []   # no ledger metadata, no LAC: the record says it all
    planned = plan_partitions(spans, ReadBounds.from_offsets(150, 450), 0, offset_per_entry=True)
    assert planned == [LedgerPartition(2, 50, 99, 100), LedgerPartition(3, 0, 249, 200)]


def test_ledgers_outside_the_range_are_not_planned():
    spans, _ = batch_spans(LedgerMetadataOnly({}), RAW, 10, 20)
    assert spans == [LedgerSpan(1, 99, 0, 99)]


def test_a_stream_that_no_longer_holds_the_promised_end_says_where_it_ends():
    sealed = StreamRecord("events", format="raw", tail=(StreamLedger(1, 0, 99),))
    assert batch_spans(LedgerMetadataOnly({}), sealed, 50, 149) == ([LedgerSpan(1, 99, 0, 99)], 99)
    assert batch_spans(LedgerMetadataOnly({}), StreamRecord("events"), 0, 9) == ([], -1)


def test_an_arrow_stream_reads_the_metadata_of_the_sealed_ledgers_in_range_only():
    record = StreamRecord("events", format="arrow", tail=(
        StreamLedger(1, 0, 999), StreamLedger(2, 1000, 1999), StreamLedger(3, 2000)))   # 3: OPEN, rows unknown
    store = LedgerMetadataOnly({1: 9, 2: 19})
    spans, reach = batch_spans(store, record, 1500, 1999)
    assert spans == [LedgerSpan(2, 19, 1000, 1999, length=0)]   # its length from its metadata, for packing
    assert reach == 1999
    assert store.read == [2]   # rule 15: nothing below the range is fetched


def test_an_arrow_ledger_with_offsets_but_open_metadata_is_refused():
    record = StreamRecord("events", format="arrow", tail=(StreamLedger(1, 0, 999),))
    with pytest.raises(LedgerError, match="ledger 1: .*not closed"):
        batch_spans(LedgerMetadataOnly({}, open_ids={1}), record, 0, 999)
