"""Secrets in topic files: each given inline, from a file or from the environment, exactly once;
they reach the clients' arguments and nothing else (repr, ConfigError, logs)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.protocol.serialization import Auth

from kspout.config import TopicConfig, load_config
from kspout.errors import ConfigError

MINIMAL = 'topic = "orders"\nspout_id = "orders-billing"\n'
ZK_SECRET = "zk-s3cret-pw"
REDIS_SECRET = "redis-s3cret-pw"
SASL_SECRET = "sasl-s3cret-pw"
KEY_SECRET = "key-s3cret-pw"
SECRETS = (ZK_SECRET, REDIS_SECRET, SASL_SECRET, KEY_SECRET)

WriteTopic = Callable[[str], Path]


@pytest.fixture
def write_topic(write_topic: WriteTopic) -> WriteTopic:
    """The shared factory (tests/unit/conftest.py), each file starting with MINIMAL."""
    return lambda text: write_topic(MINIMAL + text)


@pytest.fixture
def secret_file(tmp_path: Path) -> Callable[[str], Path]:
    """Factory: a fresh file holding `text` exactly (newlines included); returns its path."""
    counter = iter(range(1_000_000))

    def write(text: str) -> Path:
        path = tmp_path / f"secret-{next(counter)}"
        path.write_bytes(text.encode())
        return path

    return write


def config_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


def assert_hidden(config: TopicConfig) -> None:
    for text in (repr(config), str(config), repr(config.redis), repr(config.zookeeper_auth)):
        for secret in SECRETS:
            assert secret not in text


# -- each secret from each source ----------------------------------------------------------------


def test_every_secret_from_a_file_reaches_its_client(
    write_topic: WriteTopic, secret_file: Callable[[str], Path]
) -> None:
    sasl = secret_file(SASL_SECRET + "\n")
    key = secret_file(KEY_SECRET + "\r\n")
    zk = secret_file(f"kspout:{ZK_SECRET}\n")
    path = write_topic(
        f"""
[kafka]
"sasl.password_file" = "{sasl}"
"ssl.key.password_file" = "{key}"
[zookeeper_auth]
credential_file = "{zk}"
[redis]
username = "kspout"
password_file = "{secret_file(REDIS_SECRET)}"
"""
    )
    config = load_config(path)
    assert config.kazoo_args()["auth_data"] == [("digest", f"kspout:{ZK_SECRET}")]
    assert config.redis_args()["password"] == REDIS_SECRET
    kafka = config.kafka_config(**{"group.id": "g"})
    assert kafka["sasl.password"] == SASL_SECRET  # the trailing newline stripped
    assert kafka["ssl.key.password"] == KEY_SECRET  # ... a Windows one too
    assert not any(k.endswith(("_file", "_env")) for k in kafka)
    assert kafka["group.id"] == "g"
    assert_hidden(config)


def test_only_one_trailing_newline_is_stripped(
    write_topic: WriteTopic, secret_file: Callable[[str], Path]
) -> None:
    """A PEM key read into "ssl.key.pem" keeps its inner newlines."""
    pem = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----"
    key_file = secret_file(pem + "\n")
    path = write_topic(f'[kafka]\n"ssl.key.pem_file" = "{key_file}"\n')
    assert load_config(path).kafka_config()["ssl.key.pem"] == pem


def test_every_secret_from_the_environment_reaches_its_client(
    write_topic: WriteTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("T_ZK", f"kspout:{ZK_SECRET}")
    monkeypatch.setenv("T_REDIS", REDIS_SECRET)
    monkeypatch.setenv("T_SASL", SASL_SECRET)
    path = write_topic(
        """
[kafka]
"sasl.password_env" = "T_SASL"
[zookeeper_auth]
credential_env = "T_ZK"
[redis]
password_env = "T_REDIS"
"""
    )
    config = load_config(path)
    assert config.kazoo_args()["auth_data"] == [("digest", f"kspout:{ZK_SECRET}")]
    assert config.redis_args()["password"] == REDIS_SECRET
    assert config.kafka_config()["sasl.password"] == SASL_SECRET
    assert_hidden(config)


def test_inline_secrets_still_work(write_topic: WriteTopic) -> None:
    path = write_topic(
        f"""
[kafka]
"sasl.password" = "{SASL_SECRET}"
[zookeeper_auth]
credential = "kspout:{ZK_SECRET}"
[redis]
password = "{REDIS_SECRET}"
"""
    )
    config = load_config(path)
    assert config.kazoo_args()["auth_data"] == [("digest", f"kspout:{ZK_SECRET}")]
    assert config.redis_args()["password"] == REDIS_SECRET
    assert config.kafka_config()["sasl.password"] == SASL_SECRET
    assert_hidden(config)


# -- mistakes: a ConfigError naming the topic file, the key and what is allowed --------------


@pytest.mark.parametrize(
    ("section", "named"),
    [
        (
            f'[zookeeper_auth]\ncredential = "kspout:{ZK_SECRET}"\ncredential_env = "HOME"\n',
            ["zookeeper_auth", "credential_file", "given 2 times (credential, credential_env)"],
        ),
        (
            f'[redis]\npassword = "{REDIS_SECRET}"\npassword_file = "/etc/hostname"\n',
            ["redis", "password_env", "given 2 times (password, password_file)"],
        ),
        (
            f'[kafka]\n"sasl.password" = "{SASL_SECRET}"\n"sasl.password_env" = "HOME"\n',
            ["kafka", "sasl.password_file", "given 2 times (sasl.password, sasl.password_env)"],
        ),
    ],
    ids=["zookeeper", "redis", "kafka"],
)
def test_two_sources_for_one_secret_are_refused(
    write_topic: WriteTopic, section: str, named: list[str]
) -> None:
    path = write_topic(section)
    err = config_error(path)
    for text in [str(path), *named]:
        assert text in str(err)
    assert not any(secret in str(err) for secret in SECRETS)


def test_zookeeper_auth_without_a_credential_names_the_three_spellings(
    write_topic: WriteTopic,
) -> None:
    err = config_error(write_topic('[zookeeper_auth]\nscheme = "digest"\n'))
    assert err.key == "zookeeper_auth"
    assert "credential, credential_file or credential_env" in err.message


@pytest.mark.parametrize("problem", ["missing", "directory", "empty", "not-utf8"])
def test_an_unreadable_secret_file_is_named_and_its_contents_never_echoed(
    write_topic: WriteTopic, tmp_path: Path, problem: str
) -> None:
    path = tmp_path / f"secret-{problem}"
    if problem == "directory":
        path.mkdir()
    elif problem == "empty":
        path.write_bytes(b"\n")
    elif problem == "not-utf8":
        path.write_bytes(REDIS_SECRET.encode() + b"\xff\xfe")
    err = config_error(write_topic(f'[redis]\npassword_file = "{path}"\n'))
    assert err.key == "redis"
    assert "password_file" in err.message and str(path) in err.message
    assert REDIS_SECRET not in str(err)


def test_a_missing_environment_variable_is_named(
    write_topic: WriteTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("T_NOT_SET", raising=False)
    err = config_error(write_topic('[kafka]\n"sasl.password_env" = "T_NOT_SET"\n'))
    assert err.key == "kafka"
    assert "sasl.password_env" in err.message and "T_NOT_SET is not set" in err.message


def test_an_empty_environment_variable_is_refused(
    write_topic: WriteTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("T_EMPTY", "")
    err = config_error(write_topic('[zookeeper_auth]\ncredential_env = "T_EMPTY"\n'))
    assert "T_EMPTY is empty" in err.message


@pytest.mark.parametrize(
    ("section", "secret"),
    [
        ("[redis]\npassword = 918273645\n", "918273645"),
        ("[zookeeper_auth]\ncredential = 918273645\n", "918273645"),
        (f'[zookeeper_auth]\ncredential = "{ZK_SECRET}"\n', ZK_SECRET),  # no "user:"
        (f'[zookeeper_auth]\ncredential = "kspout{ZK_SECRET}:"\n', ZK_SECRET),  # no password
        (f'[redis]\nurl = "redis://kspout:{REDIS_SECRET}@127.0.0.1:6379/0"\n', REDIS_SECRET),
    ],
    ids=["number-password", "number-credential", "no-user", "no-password", "password-in-url"],
)
def test_a_malformed_secret_is_refused_without_echoing_it(
    write_topic: WriteTopic, section: str, secret: str
) -> None:
    err = config_error(write_topic(section))
    assert err.key in ("redis", "zookeeper_auth")
    assert secret not in str(err)


def test_a_password_in_the_redis_url_from_the_environment_is_refused_too(
    write_topic: WriteTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KSPOUT_REDIS_URL", f"redis://:{REDIS_SECRET}@10.0.0.1:6379/0")
    err = config_error(write_topic(""))
    assert "password_file" in err.message and REDIS_SECRET not in str(err)


def test_a_kafka_secret_cannot_set_what_kspout_sets(
    write_topic: WriteTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("T_GROUP", "theirs")
    err = config_error(write_topic('[kafka]\n"group.id_env" = "T_GROUP"\n'))
    assert err.key == "kafka" and "group.id cannot be set here" in err.message


# -- Redis TLS -----------------------------------------------------------------------------------


def test_redis_ssl_true_becomes_a_rediss_url_with_the_certificate_files(
    write_topic: WriteTopic,
) -> None:
    config = load_config(
        write_topic(
            '[redis]\nurl = "redis://10.0.0.1:6380/2"\nssl = true\n'
            'ssl_ca_certs = "/ca.pem"\nssl_certfile = "/client.pem"\nssl_keyfile = "/client.key"\n'
        )
    )
    assert config.redis.tls
    assert config.redis_args() == {
        "url": "rediss://10.0.0.1:6380/2",  # redis-py chooses TLS by the scheme alone
        "ssl_ca_certs": "/ca.pem",
        "ssl_certfile": "/client.pem",
        "ssl_keyfile": "/client.key",
    }


def test_a_rediss_url_alone_means_tls(write_topic: WriteTopic) -> None:
    config = load_config(
        write_topic('[redis]\nurl = "rediss://10.0.0.1:6380/0"\nssl_ca_certs = "/ca.pem"\n')
    )
    assert config.redis.tls
    assert config.redis_args() == {"url": "rediss://10.0.0.1:6380/0", "ssl_ca_certs": "/ca.pem"}


def test_plain_redis_gets_no_tls_arguments(write_topic: WriteTopic) -> None:
    config = load_config(write_topic('[redis]\nusername = "kspout"\n'))
    assert not config.redis.tls
    assert config.redis_args() == {"url": "redis://127.0.0.1:6379/0", "username": "kspout"}


@pytest.mark.parametrize(
    ("section", "mentions"),
    [
        ('ssl_ca_certs = "/ca.pem"\n', ["ssl_ca_certs", "ssl = true", "rediss://"]),
        ('ssl = true\nssl_keyfile = "/k.pem"\n', ["ssl_keyfile needs ssl_certfile"]),
        ('url = "unix:///run/redis.sock"\nssl = true\n', ["unix://"]),
        ('url = "http://10.0.0.1/"\n', ["redis://", "rediss://", "unix://"]),
    ],
    ids=["tls-file-without-tls", "key-without-cert", "tls-over-unix", "scheme"],
)
def test_inconsistent_redis_tls_settings_are_refused(
    write_topic: WriteTopic, section: str, mentions: list[str]
) -> None:
    err = config_error(write_topic("[redis]\n" + section))
    assert err.key == "redis"
    for text in mentions:
        assert text in err.message


# -- logs ----------------------------------------------------------------------------------------


def test_kazoo_debug_log_of_the_auth_request_hides_the_credential(
    write_topic: WriteTopic, caplog: pytest.LogCaptureFixture
) -> None:
    """kazoo logs every request it sends at DEBUG, its Auth request (credential) included."""
    config = load_config(write_topic(f'[zookeeper_auth]\ncredential = "kspout:{ZK_SECRET}"\n'))
    config.kazoo_args()
    caplog.set_level(logging.DEBUG, logger="kazoo")
    request = Auth(0, "digest", f"kspout:{ZK_SECRET}")
    logging.getLogger("kazoo.client").debug("Sending request(xid=%s): %s", -4, request)
    assert "Sending request(xid=-4): Auth(" in caplog.text and "scheme='digest'" in caplog.text
    assert ZK_SECRET not in caplog.text
