"""The demo and what it shares with the benchmarks and the soak: not part of the connector.

job.py is the main job (`python -m connector.demo`, scripts/demo.sh): a local cluster, a Spark write, a
crashed writer (dangling.py, run as its own process) and a Spark read that recovers its ledger.
sample.py makes the sample rows (from Spark or plain Arrow) and session.py a local SparkSession with the
ledger format registered. This package may use the local-cluster tool (connector/cluster.py);
connector/spark and connector/client never import it.
"""
