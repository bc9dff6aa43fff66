"""Issue 16 item 8: a process that opens, uses and closes many clients (a service, Spark's reused Python
workers, a script) stays quiet: one client event loop per process, so grpc.aio never calls into a
closed loop ("RuntimeError: Event loop is closed" tracebacks on stderr)."""
import subprocess
import sys

SCRIPT = """
import sys
from connector.client import LedgerClient
for i in range(50):
    with LedgerClient(sys.argv[1], timeout=3.0) as client:
        with client.create_ledger(3, 3, 2) as writer:
            writer.append(b"entry %d" % i)
        assert [e.payload for e in client.open_ledger(writer.ledger_id).read()] == [b"entry %d" % i]
print("50 clients")
"""


def test_fifty_clients_in_one_process_leave_no_traceback(cluster, metadata_uri):
    cluster(3)
    run = subprocess.run([sys.executable, "-c", SCRIPT, metadata_uri], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "50 clients", run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "Event loop is closed" not in run.stderr, run.stderr[-3000:]
