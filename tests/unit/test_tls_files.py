"""The client's TLS files (connector/client/security.py): a CA bundle, certificate or key that is not PEM of its
kind is refused when the settings are parsed (CLI options, Spark options, the environment), naming the file, the
block it lacks and the option; not taken silently to fail at a handshake."""
import pytest

from connector.client import SecurityConfigError, TlsConfig
from connector.spark.errors import InvalidOptionError
from connector.spark.options import LedgerOptions
from protos.pem import CERTIFICATE, PRIVATE_KEY, missing_pem

CERT = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n"


@pytest.fixture
def files(tmp_path):
    for name, data in (("ca.pem", CERT), ("cert.pem", CERT), ("key.pem", KEY), ("der.bin", b"\x30\x82\x01\x0a")):
        (tmp_path / name).write_bytes(data)
    return tmp_path


@pytest.mark.parametrize("which, lacking, names", [
    ("ca", "no PEM certificate (-----BEGIN CERTIFICATE-----)", "tlsCa / --tls-ca"),
    ("cert", "no PEM certificate (-----BEGIN CERTIFICATE-----)", "tlsCert / --tls-cert"),
    ("key", "no PEM private key (-----BEGIN PRIVATE KEY-----)", "tlsKey / --tls-key"),
])
def test_a_file_that_is_not_pem_is_refused_when_the_settings_are_parsed(files, which, lacking, names):
    paths = {"ca": str(files / "ca.pem"), "cert": str(files / "cert.pem"), "key": str(files / "key.pem"),
             which: str(files / "der.bin")}
    with pytest.raises(SecurityConfigError) as refused:
        TlsConfig.from_paths(paths["ca"], paths["cert"], paths["key"])
    assert f"{files / 'der.bin'} holds {lacking}; {names}" in str(refused.value)
    spark = {"metadata": "zk://127.0.0.1:2181/l", "path": "s", "tlsCa": paths["ca"], "tlsCert": paths["cert"],
             "tlsKey": paths["key"]}
    with pytest.raises(InvalidOptionError, match=f"holds {lacking}".replace("(", r"\(").replace(")", r"\)")):
        LedgerOptions.parse(spark)


def test_pem_files_of_their_kind_are_taken():
    assert missing_pem(CERT, CERTIFICATE) is None and missing_pem(KEY, PRIVATE_KEY) is None
    assert missing_pem(b"-----BEGIN RSA PRIVATE KEY-----\n", PRIVATE_KEY) is None
    assert missing_pem(KEY, CERTIFICATE) == "no PEM certificate (-----BEGIN CERTIFICATE-----)"


def test_the_parsed_settings_keep_the_paths(files):
    tls = TlsConfig.from_paths(str(files / "ca.pem"), str(files / "cert.pem"), str(files / "key.pem"))
    assert tls == TlsConfig(str(files / "ca.pem"), str(files / "cert.pem"), str(files / "key.pem"))
    assert tls.pem_files() == (CERT, KEY, CERT)
