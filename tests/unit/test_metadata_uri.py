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
