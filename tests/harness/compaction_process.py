"""A compaction in its own process, to be SIGKILLed at a step.

python -m tests.harness.compaction_process URI STREAM TARGET_BYTES GRACE CRASH_AT
Compacts the stream, printing `step <step> <compaction id>` after each step; at CRASH_AT it stops there
(prints `stopped <step>` and waits for the kill) instead of going on. Prints `done` if it gets to the end.
"""
import sys
import threading

from connector.client import LedgerClient
from connector.compaction import CompactionPolicy, compact_stream


def main(uri: str, stream: str, target_bytes: str, grace: str, crash_at: str) -> int:
    def on_step(step: str, compaction) -> None:
        print(f"step {step} {compaction.compaction_id}", flush=True)
        if step == crash_at:
            print(f"stopped {step}", flush=True)
            threading.Event().wait()

    with LedgerClient(uri) as client:
        compact_stream(client, stream, CompactionPolicy(target_bytes=int(target_bytes), grace=float(grace)),
                       wait=True, on_step=on_step)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
