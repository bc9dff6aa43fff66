"""A stream owner in its own process, for SIGSTOP/SIGCONT handover tests.

python -m tests.harness.stream_writer_process URI STREAM
Appends "p-<n>" payloads as fast as acknowledgements come back, printing `acked <offset> <payload>` for
each acknowledged entry, and `fenced` (then exits 0) once another owner has taken the stream over.
"""
import sys

from connector.client import LedgerClient, LedgerFencedError, Streams


def main(uri: str, stream: str) -> int:
    with LedgerClient(uri) as client:
        writer = Streams(client).open_writer(stream)
        print("owner", flush=True)
        n = 0
        while True:
            payload = f"p-{n}".encode()
            try:
                offset = writer.append(payload)
            except LedgerFencedError:
                print("fenced", flush=True)
                return 0
            print(f"acked {offset} {payload.decode()}", flush=True)
            n += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
