"""Metadata URIs parsed without ZooKeeper: a secret never shows in an error, and one holding '@' says how to write
it."""
import pytest

from metadata.errors import InvalidMetadataUriError
from metadata.store import MetadataUri, redact_uri


@pytest.mark.parametrize("uri", ["zk://admin:p@ssw0rd!@127.0.0.1:1/l", "zk://admin:p/ss@127.0.0.1:1/l",
                                 "zk://admin:s3cr@t@127.0.0.1:1"])
def test_a_secret_holding_at_or_slash_is_redacted_whole_and_the_error_says_to_percent_encode(uri):
    with pytest.raises(InvalidMetadataUriError) as refused:
        MetadataUri.parse(uri)
    message = str(refused.value)
    assert "zk://admin:***@127.0.0.1:1" in message
    assert not any(part in message for part in ("ssw0rd", "p/ss", "s3cr", "@t@")), message
    assert "percent-encode '@', ':' and '/' in the user or secret: '@' as %40" in message


def test_a_percent_encoded_secret_parses_to_the_secret():
    uri = MetadataUri.parse("zk://admin:p%40ssw0rd!@127.0.0.1:1/l")
    assert (uri.credentials.user, uri.credentials.secret, uri.hosts) == ("admin", "p@ssw0rd!", "127.0.0.1:1")
    assert str(uri) == "zk://admin:***@127.0.0.1:1/l"


def test_redaction_keeps_the_hosts_of_every_uri_in_a_line():
    assert redact_uri("from zk://a:x@y@h1:1/r to zk://b:z@h2:2/r") == "from zk://a:***@h1:1/r to zk://b:***@h2:2/r"


@pytest.mark.parametrize("uri, user", [("zk://us@er:s3cret@127.0.0.1:1/l", "us@er"),
                                       ("zk://us/er:s3cret@127.0.0.1:1/l", "us/er")])
def test_a_secret_after_a_user_holding_at_or_slash_is_redacted(uri, user):
    """Review 2026-11-29: the redaction took the user to end at the first '@' or '/': after such a user, the whole
    secret showed in the error."""
    with pytest.raises(InvalidMetadataUriError) as refused:
        MetadataUri.parse(uri)
    assert f"zk://{user}:***@127.0.0.1:1" in str(refused.value) and "s3cret" not in str(refused.value)


@pytest.mark.parametrize("uri, refusal", [
    # kazoo refused these with a bare "ValueError: relative paths not allowed" traceback (an audit's)
    ("zk://127.0.0.1:1/ledgers/../ledgers", "its root /ledgers/../ledgers has a '.' or '..' segment"),
    ("zk://127.0.0.1:1/a/./b", "its root /a/./b has a '.' or '..' segment"),
    ("zk://127.0.0.1:1/..", "its root /.. has a '.' or '..' segment"),
    # `ledger init` initialised a ledger store inside ZooKeeper's own tree (only /zookeeper itself was refused)
    ("zk://127.0.0.1:1/zookeeper", "its root /zookeeper is in /zookeeper, the tree ZooKeeper keeps for itself"),
    ("zk://127.0.0.1:1/zookeeper/quota", "its root /zookeeper/quota is in /zookeeper"),
])
def test_a_root_that_is_no_znode_path_or_is_zookeepers_own_is_refused(uri, refusal):
    with pytest.raises(InvalidMetadataUriError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        MetadataUri.parse(uri)


@pytest.mark.parametrize("root", ["/zookeepers", "/ledgers/.x", "/a/b..c", "/zookeeper-ledgers"])
def test_roots_that_only_look_alike_are_taken(root):
    assert MetadataUri.parse(f"zk://127.0.0.1:1{root}").root == root
