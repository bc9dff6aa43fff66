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
