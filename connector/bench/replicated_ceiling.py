"""The replicated write ceiling: the least a replicated store written from a Python Data Source does with the rows.

`ledger bench spark` writes the same DataFrame to this source beside the ledger and the plain ceiling
(connector/bench/ceiling.py, which only counts the rows). Each task cuts its rows into entries exactly as a ledger
write task does (connector/spark/encoding.py: EntryBuilder, the same entryBytes and compression) and sends every
entry's bytes to each of the node ceiling's servers (connector/bench/node_ceiling.py: one stream each, a group of
messages appended with one write and fdatasynced, then answered), and an entry counts once `ackQuorum` servers
made it durable, `WINDOW` entries in flight, as the ledger's replicated writer (E = WQ = the servers, AQ). No digest,
no record framing, no index, no metadata: what is left is what every replicated store of these rows pays on this
machine (the JVM handing the rows over, the codec, three copies through gRPC and the disk), so the plain ceiling's
time over this one is the most "ledger write >= 0.7 of the ceiling" can reach here; where it is below 0.7, that
target is bound on this machine, in that run.
"""
from __future__ import annotations

import threading

import grpc
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from connector.bench.ceiling import SCHEMA
from connector.bench.node_ceiling import METHOD
from connector.spark.encoding import EntryBuilder

WINDOW = 64            # entries in flight per task (the ledger writer's pipeline keeps more; this errs fast)
WAIT_SECONDS = 120.0   # for the servers' answers: none within it fails the task
_MAX_MESSAGE = 256 * 1024 * 1024


class _Replicas:
    """One stream to each server; the entries each has made durable (it answers in order)."""

    def __init__(self, addresses: list[str], ack_quorum: int):
        self.ack_quorum = ack_quorum
        self.durable = [0] * len(addresses)
        self.changed = threading.Condition()
        self._queues: list[list] = [[] for _ in addresses]
        self._wakeups = [threading.Condition() for _ in addresses]
        self._channels = [grpc.insecure_channel(a, options=[("grpc.max_send_message_length", _MAX_MESSAGE)])
                          for a in addresses]
        self._failure: BaseException | None = None
        self._closing = False
        self._readers = []
        for index, channel in enumerate(self._channels):
            answers = channel.stream_stream(METHOD)(self._requests(index))
            reader = threading.Thread(target=self._read, args=(index, answers), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _requests(self, index: int):
        queue, wakeup = self._queues[index], self._wakeups[index]
        while True:
            with wakeup:
                wakeup.wait_for(lambda: queue)
                message = queue.pop(0)
            if message is None:
                return
            yield message

    def _read(self, index: int, answers) -> None:
        """The server's answers; the end of its stream before close() is a failure (nothing more will come)."""
        try:
            for answer in answers:
                with self.changed:
                    self.durable[index] += int.from_bytes(answer, "little")
                    self.changed.notify_all()
            failure = None if self._closing else RuntimeError(f"server {index} ended its stream")
        except grpc.RpcError as exc:
            failure = exc
        if failure is not None:
            with self.changed:
                self._failure = failure
                self.changed.notify_all()

    def acked(self) -> int:
        return sorted(self.durable, reverse=True)[self.ack_quorum - 1]

    def send(self, entry: bytes) -> None:
        for queue, wakeup in zip(self._queues, self._wakeups):
            with wakeup:
                queue.append(entry)
                wakeup.notify()

    def wait_until(self, ready) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: ready() or self._failure is not None, WAIT_SECONDS):
                raise TimeoutError(f"the node ceiling's servers did not answer within {WAIT_SECONDS:.0f} s")
            if self._failure is not None:
                raise RuntimeError(f"a node ceiling server failed: {self._failure}")

    def close(self) -> None:
        self._closing = True
        for queue, wakeup in zip(self._queues, self._wakeups):
            with wakeup:
                queue.append(None)
                wakeup.notify()
        for reader in self._readers:
            reader.join(WAIT_SECONDS)
        for channel in self._channels:
            channel.close()


class ReplicatedCeilingWriter(DataSourceArrowWriter):
    def __init__(self, addresses: list[str], ack_quorum: int, entry_bytes: int, compression: str | None):
        self.addresses, self.ack_quorum = addresses, ack_quorum
        self.entry_bytes, self.compression = entry_bytes, compression

    def write(self, iterator) -> WriterCommitMessage:
        replicas = _Replicas(self.addresses, self.ack_quorum)
        try:
            sent = 0
            builder = None
            for batch in iterator:
                if builder is None:
                    builder = EntryBuilder(batch.schema, self.entry_bytes, self.compression)
                for entry in builder.add(batch):
                    replicas.wait_until(lambda: sent - replicas.acked() < WINDOW)
                    replicas.send(entry)
                    sent += 1
            for entry in builder.finish() if builder is not None else ():
                replicas.send(entry)
                sent += 1
            replicas.wait_until(lambda: replicas.acked() >= sent)
        finally:
            replicas.close()
        return WriterCommitMessage()

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass


class ReplicatedCeilingDataSource(DataSource):
    """Writing only. Options: servers (comma-separated host:port of node ceiling servers), ackQuorum, entryBytes,
    compression (none, lz4, zstd)."""

    @classmethod
    def name(cls) -> str:
        return "ledger_bench_replicated_ceiling"

    def schema(self) -> str:
        return SCHEMA

    def writer(self, schema, overwrite: bool) -> ReplicatedCeilingWriter:
        compression = self.options.get("compression", "none")
        return ReplicatedCeilingWriter(self.options["servers"].split(","), int(self.options["ackquorum"]),
                                       int(self.options["entrybytes"]), None if compression == "none" else compression)
