"""Names that become znodes (metadata/layout.py): stream names and storage node ids, checked without ZooKeeper."""
import pytest

from metadata.layout import is_name, is_node_id


@pytest.mark.parametrize("name", ["events\n", "a\nb", "", ".hidden", "a/b", "x" * 201])
def test_a_stream_name_outside_the_rule_is_refused(name):
    """Review 2 of 2026-11-29: the rule's `$` matched before a trailing newline, so 'events\\n' passed the check and
    reached ZooKeeper, which refuses a control character in a path."""
    assert not is_name(name)


@pytest.mark.parametrize("node_id", ["n1\n", "a\x85b", "é" * 101, "n\U0001F600", "-n1"])
def test_a_node_id_zookeeper_or_a_local_cluster_cannot_take_is_refused(node_id):
    """The same for node ids; and C1 control characters and characters beyond U+FFFF (ZooKeeper refuses them too), a
    leading '-' (a local cluster passes the id as an argument), and the rule's length is in bytes, as a file name's
    is (a local cluster names the node's log file after it)."""
    assert not is_node_id(node_id)


def test_names_in_the_rules_are_taken():
    assert is_name("events.v2_raw-1") and is_node_id("10.0.0.7:3181") and is_node_id("é" * 100)
