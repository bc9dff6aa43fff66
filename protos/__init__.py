"""The wire: generated gRPC code, the hand-written add encoding, digests, refusal wording, the ready file.

Importing this package (connector and storage_node import it first) turns gRPC's fork support off for the
process unless GRPC_ENABLE_FORK_SUPPORT says otherwise, before gRPC is loaded. With it on (grpcio's default),
a process whose gRPC threads are busy that starts a subprocess through a fork that runs Python before exec
(subprocess.Popen with preexec_fn, as pyspark starts its JVM) has gRPC's after-fork handler restart its
poller in the child, where the closing of inherited descriptors makes it crash before exec
(grpc/grpc#43055): a driver with a LedgerClient in use that then starts a SparkSession failed with
JAVA_GATEWAY_EXITED; tests/integration/test_grpc_fork.py saw 113 of 300 such children die without this.
Nothing here forks a process that goes on using gRPC without exec, which is all fork support is for.
The setting only works if it comes before the process's first `import grpc`.
"""
import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
