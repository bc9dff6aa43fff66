"""A truncation in its own process, to be SIGKILLed at a step.

python -m tests.harness.truncate_process URI STREAM BEFORE_OFFSET CRASH_AT
Truncates the stream before BEFORE_OFFSET, printing `step <step>` after each step (planned, cut, deleted); at
CRASH_AT it stops there (prints `stopped <step>` and waits for the kill) instead of going on. Prints `done` if it
gets to the end.
"""
import sys
import threading

from connector.client import LedgerClient
from connector.retention import truncate_stream


def main(uri: str, stream: str, before: str, crash_at: str) -> int:
    def on_step(step: str, cut) -> None:
        print(f"step {step}", flush=True)
        if step == crash_at:
            print(f"stopped {step}", flush=True)
            threading.Event().wait()

    with LedgerClient(uri) as client:
        truncate_stream(client, stream, int(before), on_step=on_step)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
