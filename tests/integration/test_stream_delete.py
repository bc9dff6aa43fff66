"""`ledger stream delete` against updates that race it, and a delete that stopped part-way (review 2026-11-29).

ZooKeeper deletes a znode's children before the znode, so the head of a stream being deleted was the last thing
to go: a commit (or a compaction's swap) could land on it while its books were deleted, and the delete then
stopped with the stream half gone: reads of it failing with OffsetsGoneError, ledgers no page named any more. The
delete now marks the head deleting first, by a compare-and-set, after which the stream is gone to every reader
and writer while its pages and ledgers are deleted."""
import pytest
from kazoo.client import KazooClient

from connector.cli import main
from metadata import layout, streams
from metadata.errors import NoSuchStreamError, StreamBeingDeletedError
from metadata.model import StreamLedger, StreamRecord
from metadata.store import MetadataStore
from tests.harness.stream_fixtures import appended, closed_ledgers

PAGE, BOOK = 4, 4


@pytest.fixture(autouse=True)
def small_pages(monkeypatch):
    monkeypatch.setattr(streams, "PAGE_LEDGERS", PAGE)
    monkeypatch.setattr(streams, "BOOK_PAGES", BOOK)


def existing(store: MetadataStore, ids) -> list[int]:
    return [i for i in ids if store.exists(layout.ledger_path(i))]


def one_more(store: MetadataStore, name: str) -> StreamRecord:
    """A commit of one more ledger onto the stream (it seals a page when the tail is full)."""
    [ledger_id] = closed_ledgers(store, 1)

    def add(record: StreamRecord) -> StreamRecord:
        offset = record.next_offset
        return record.replace(tail=record.tail + (StreamLedger(ledger_id, offset, offset + 9),))
    return streams.update_stream(store, name, add).value


def test_a_commit_racing_a_delete_finds_the_stream_gone_and_the_delete_deletes_every_ledger(
        store, metadata_uri, monkeypatch):
    ids = closed_ledgers(store, 40)
    appended(store, "events", ids)                  # pages in several books, and a tail
    assert len(store.children(layout.stream_books_path("events"))) > 1
    raced = []
    real_delete = KazooClient.delete

    def delete(client, path, *args, **kwargs):      # another client commits while the delete is under way
        if "/books/" in path and not raced:
            with MetadataStore(metadata_uri) as other:
                try:
                    raced.append(one_more(other, "events"))
                except NoSuchStreamError as exc:
                    raced.append(exc)
        return real_delete(client, path, *args, **kwargs)

    monkeypatch.setattr(KazooClient, "delete", delete)
    assert main(["stream", "delete", "events", "--yes", "--metadata", metadata_uri]) == 0
    assert isinstance(raced[0], NoSuchStreamError), raced   # landed on the head before the fix
    assert not store.exists(layout.stream_path("events"))
    assert existing(store, ids) == []


def test_a_delete_that_stopped_after_its_mark_is_finished_by_running_it_again(store, metadata_uri):
    ids = closed_ledgers(store, 12)
    appended(store, "events", ids)
    marked = streams.mark_deleting(store, "events")   # the delete's first step; then it stopped
    assert marked.value.deleting and streams.find_stream(store, "events") is None
    with pytest.raises(NoSuchStreamError):
        one_more(store, "events")
    with pytest.raises(StreamBeingDeletedError, match="is being deleted"):
        streams.update_stream(store, "events", lambda r: r, create=StreamRecord("events", "raw"))
    assert existing(store, ids) == ids
    assert main(["stream", "delete", "events", "--yes", "--metadata", metadata_uri]) == 0
    assert existing(store, ids) == [] and not store.exists(layout.stream_path("events"))
    streams.update_stream(store, "events", lambda r: r, create=StreamRecord("events", "raw"))   # a new one


def test_a_delete_whose_compaction_records_cannot_be_read_still_deletes_the_streams_ledgers(
        store, metadata_uri, monkeypatch, capsys):
    """Review 2026-11-29: the compaction records were read after the head was gone and before the stream's own
    ledgers were deleted; a failure there left every ledger of the stream, named nowhere any more."""
    from connector import compaction
    from metadata.errors import MetadataError

    ids = closed_ledgers(store, 12)
    appended(store, "events", ids)

    def unreadable(*args, **kwargs):
        raise MetadataError("scripted: ZooKeeper did not answer")

    monkeypatch.setattr(compaction, "stream_deleted", unreadable)
    assert main(["stream", "delete", "events", "--yes", "--metadata", metadata_uri]) == 1
    assert existing(store, ids) == []
    assert "the stream's compaction records were not read (scripted" in capsys.readouterr().err


def test_a_delete_whose_ledger_deletes_fail_keeps_the_stream_marked_and_run_again_deletes_the_rest(
        store, metadata_uri, monkeypatch, capsys):
    """Review 2026-11-29: the head and its pages were deleted before the ledgers, so a delete that stopped (or
    failed) among the ledgers left the rest named nowhere: run again, it found no stream. The head and pages now go
    last, once every ledger is gone."""
    from connector.commands import stream as stream_command
    from metadata.errors import LedgerError

    ids = closed_ledgers(store, 40)
    appended(store, "events", ids)
    real_discard, calls = stream_command.discard, []

    def failing_after_five(client, ledger_id, password):
        calls.append(ledger_id)
        if len(calls) > 5:
            raise LedgerError("scripted: node unreachable")
        return real_discard(client, ledger_id, password)

    monkeypatch.setattr(stream_command, "discard", failing_after_five)
    assert main(["stream", "delete", "events", "--yes", "--metadata", metadata_uri]) == 1
    assert "the stream stays marked deleting: run `ledger stream delete` again" in capsys.readouterr().err
    assert len(existing(store, ids)) == 35 and streams.find_stream(store, "events") is None
    assert main(["stream", "list", "--metadata", metadata_uri]) == 0      # the operator can see it
    assert "events                    being deleted: run `ledger stream delete events` to finish" in \
        capsys.readouterr().out
    monkeypatch.setattr(stream_command, "discard", real_discard)
    assert main(["stream", "delete", "events", "--yes", "--metadata", metadata_uri]) == 0
    assert existing(store, ids) == [] and not store.exists(layout.stream_path("events"))


def test_a_znode_a_late_cut_creates_under_the_marked_head_does_not_stop_the_delete(store, metadata_uri, monkeypatch):
    """A cut or compaction that read the head before its mark may still create its record or plan mark under the
    head (they are no compare-and-set of it): the delete of the head then found it not empty and stopped."""
    ids = closed_ledgers(store, 12)
    appended(store, "events", ids)
    late = []
    real_delete = KazooClient.delete

    def delete(client, path, *args, **kwargs):
        if "/books/" in path and not late:
            with MetadataStore(metadata_uri) as other:
                late.append(other.create(layout.stream_path("events") + "/compaction-mark", b"late"))
        return real_delete(client, path, *args, **kwargs)

    monkeypatch.setattr(KazooClient, "delete", delete)
    assert main(["stream", "delete", "events", "--yes", "--metadata", metadata_uri]) == 0
    assert late and not store.exists(layout.stream_path("events")) and existing(store, ids) == []


def test_a_delete_whose_reply_is_lost_leaves_the_stream_made_again_meanwhile(store, metadata_uri, monkeypatch):
    """The head's delete lands, its reply is lost, and while the delete reconnects a writer makes the stream again
    and appends (a streaming query's next batch does, as its prepare makes the stream): the delete was sent again
    whole and deleted the new stream with its acknowledged appends (lost-reply audit, 2026-11-29)."""
    from tests.harness.lost_reply import LostReplies

    ids = closed_ledgers(store, 12)
    appended(store, "events", ids)
    made_again = []

    def meanwhile():
        with MetadataStore(metadata_uri) as other:
            assert streams.find_stream(other, "events", deleting=True) is None
            [new] = closed_ledgers(other, 1)
            appended(other, "events", [new])
            made_again.append(new)

    lost = LostReplies(monkeypatch, lambda operation, path, _: operation in ("delete", "_delete_created")
                       and path == layout.stream_path("events"), meanwhile)
    assert main(["stream", "delete", "events", "--yes", "--metadata", metadata_uri]) == 0
    assert [path for _, path in lost.lost] == [layout.stream_path("events")] and made_again
    assert existing(store, ids) == []
    record = streams.read_stream(store, "events").value     # the new stream, whole
    assert not record.deleting and [ledger.ledger_id for ledger in record.tail] == made_again
