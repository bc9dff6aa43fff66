"""A local cluster's ports are distinct: free_port() frees its port again, and the kernel may hand it out twice."""
import itertools

import pytest

from connector.cluster import ClusterError, distinct_port


def test_a_port_already_recorded_is_never_handed_out_again():
    picks = iter([57295, 57295, 41000])    # what a fresh cluster's node-1 and node-2 were given in a CI run
    assert distinct_port({2181, 57295}, pick=picks.__next__) == 41000


def test_a_pick_that_keeps_repeating_recorded_ports_fails_clearly():
    with pytest.raises(ClusterError, match="no free port outside"):
        distinct_port({57295}, pick=itertools.repeat(57295).__next__, attempts=3)


def test_the_failure_counts_the_recorded_ports_instead_of_listing_them():
    """`cluster start --nodes 1000000000` printed every port recorded, about 100 KB (an audit's)."""
    recorded = set(range(1024, 60000))
    with pytest.raises(ClusterError) as failed:
        distinct_port(recorded, pick=itertools.cycle(sorted(recorded)).__next__, attempts=3)
    assert str(failed.value) == "no free port outside the 58976 this cluster recorded after 3 tries"
