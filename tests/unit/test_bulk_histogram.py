"""The client's add-latency histogram takes a batch's observations at once and exposes what
prometheus_client's own Histogram would for the same observations."""
import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from connector.client.metrics import BulkHistogram

BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.1, 1.0, 10.0)
latencies = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


def exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def split_sum(lines: list[str]) -> tuple[list[str], float]:
    """The lines but _sum, and the sum (added up per batch, it may differ in the last bits of the float)."""
    sums = [float(line.split()[1]) for line in lines if line.startswith("add_latency_seconds_sum")]
    return [line for line in lines if not line.startswith("add_latency_seconds_sum")], sums[0]


@given(st.lists(st.lists(latencies, max_size=50), max_size=10))
def test_batches_expose_what_one_observation_at_a_time_does(batches):
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    histogram = Histogram("add_latency_seconds", "doc", buckets=BUCKETS, registry=theirs)
    bulk = BulkHistogram("add_latency_seconds", "doc", BUCKETS, ours)
    for batch in batches:
        for value in batch:
            histogram.observe(value)
        bulk.observe_many(batch)
    (our_lines, our_sum), (their_lines, their_sum) = split_sum(exposition(ours)), split_sum(exposition(theirs))
    assert our_lines == their_lines
    assert math.isclose(our_sum, their_sum, rel_tol=1e-9, abs_tol=1e-12)


def test_a_bound_itself_counts_in_its_bucket():
    registry = CollectorRegistry()
    BulkHistogram("h_seconds", "doc", (0.5, 1.0), registry).observe_many([0.5, 1.0, 1.5])
    lines = exposition(registry)
    assert 'h_seconds_bucket{le="0.5"} 1.0' in lines and 'h_seconds_bucket{le="1.0"} 2.0' in lines
    assert 'h_seconds_bucket{le="+Inf"} 3.0' in lines and "h_seconds_count 3.0" in lines
