"""Security against real servers: the spout's ZooKeeper tree under the digest ACL, Redis with an
ACL user and with TLS (servers of this test's own), and no secret in `kspout`'s output.

Secrets come from files and the environment here, as in production; inline values are covered
by the unit tests (tests/unit/test_config_secrets.py). Kafka's SASL/SSL are not exercised yet:
the embedded broker listens on PLAINTEXT only, so the Kafka secrets are only checked to stay
unprinted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis
import trustme
from click.testing import CliRunner
from confluent_kafka import Producer
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError

from dedup import Effects, IdempotencyBolt
from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack, RedisServer
from kspout.devstack.ports import LOOPBACK
from kspout.driver import Driver, Progress
from kspout.errors import RedisLoginRefused, RedisTlsRefused, StackError
from kspout.executor.local import LocalExecutor
from kspout.kafka import Record
from tests.integration.helpers import PARTITIONS, produce

ZK_PASSWORD = "zk-s3cret-pw"
REDIS_USER = "kspout"
REDIS_PASSWORD = "redis-s3cret-pw"
SASL_PASSWORD = "sasl-s3cret-pw"
KEY_PASSWORD = "key-s3cret-pw"
SECRETS = (ZK_PASSWORD, REDIS_PASSWORD, SASL_PASSWORD, KEY_PASSWORD)
MESSAGES = 20  # per partition


def secret_file(path: Path, value: str) -> Path:
    """A secret file as `echo` or a Kubernetes secret mount leaves it: a trailing newline."""
    path.write_text(value + "\n")
    return path


def own_zk_root() -> str:
    """A zk_root for one test: kspout creates it under the test's ACL, which would close a
    shared root (the other tests' `/run-test`) to every client without the credential."""
    return f"/security-{uuid.uuid4().hex[:8]}"


def ignore(record: Record) -> None:
    """A handler that accepts every record (for `kspout run --handler`)."""


def id_of(partition: int, offset: int) -> bytes:
    return b"id-%d-%d" % (partition, offset)


# -- ZooKeeper: the whole spout tree under the digest ACL ------------------------------------------


@contextmanager
def kazoo(**args: Any) -> Iterator[KazooClient]:
    client = KazooClient(timeout=10.0, **args)
    client.start(timeout=15.0)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def walk(client: KazooClient, path: str) -> list[str]:
    """`path` and every node below it."""
    found = [path]
    for child in sorted(client.get_children(path)):
        found += walk(client, f"{path}/{child}")
    return found


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# What a client may try on a node; every one needs a right the ACL gives the credential only
# (deleting a node needs DELETE on its parent, which is in the tree too, or is the zk_root).
INTRUSIONS: dict[str, Callable[[KazooClient, str], object]] = {
    "get": lambda zk, path: zk.get(path),
    "get_children": lambda zk, path: zk.get_children(path),
    "set": lambda zk, path: zk.set(path, b"intruder"),
    "create a child": lambda zk, path: zk.create(f"{path}/intruder", b"intruder"),
    "delete": lambda zk, path: zk.delete(path),
}


def test_a_client_without_the_zookeeper_credentials_can_neither_read_nor_write_the_spout_tree(
    make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    credential = secret_file(tmp_path / "zk-credential", f"kspout:{ZK_PASSWORD}")
    config = make_config(zk_root=own_zk_root(), zookeeper_auth={"credential_file": str(credential)})
    produce(producer, config.topic, {p: range(MESSAGES) for p in PARTITIONS})

    with Driver(config, LocalExecutor(config, ignore)) as driver:
        deadline = time.monotonic() + 60  # by time, not steps: a start under load is slow
        while True:
            committed = {v.partition: v.committed for v in driver.progress().partitions}
            if committed == dict.fromkeys(PARTITIONS, MESSAGES) or time.monotonic() > deadline:
                break
            driver.step()
        assert committed == dict.fromkeys(PARTITIONS, MESSAGES)

        # Still running: its ephemeral nodes (instance, claims) exist.
        wrong = [("digest", "kspout:wrong-password")]
        with (
            kazoo(**config.kazoo_args()) as owner,
            kazoo(hosts=config.zookeeper) as anonymous,
            kazoo(hosts=config.zookeeper, auth_data=wrong) as impostor,
        ):
            tree = walk(owner, config.zk_spout_path)
            nodes = {path: owner.get(path) for path in tree}
            records = [
                path
                for path, (raw, _) in nodes.items()
                if json_object(raw).get("topic") == config.topic and "offset" in json_object(raw)
            ]
            instances = [
                path
                for path, (raw, stat) in nodes.items()
                if stat.ephemeralOwner and json_object(raw).get("pid") == os.getpid()
            ]
            assert len(records) == len(PARTITIONS), tree
            assert len(instances) == 1, tree

            leaks = []
            for name, intruder in (("anonymous", anonymous), ("wrong password", impostor)):
                for path in tree:
                    for what, attempt in INTRUSIONS.items():
                        try:
                            attempt(intruder, path)
                        except NoAuthError:
                            continue
                        except KazooException as exc:
                            leaks.append(f"{name}: {what} {path}: {type(exc).__name__}")
                        else:
                            leaks.append(f"{name}: {what} {path}: allowed")
            assert leaks == [], f"{len(leaks)} of {2 * len(tree) * len(INTRUSIONS)} got through"


# -- Redis with an ACL user ----------------------------------------------------------------------


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of this test's own whose only enabled user is REDIS_USER."""
    server = RedisServer(tmp_path)
    server.start()
    admin = redis.Redis(host=LOOPBACK, port=server.port)
    try:
        admin.acl_setuser(
            REDIS_USER,
            enabled=True,
            passwords=[f"+{REDIS_PASSWORD}"],
            keys=["*"],
            commands=["+@all"],
        )
        admin.acl_setuser("default", enabled=False)  # no login without REDIS_USER's password
    finally:
        admin.close()
    yield server
    server.stop()


class Count:
    """The dedup handler: counts each applied message id in a Redis hash."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, record: Record, effects: Effects) -> None:
        effects.hincrby(self.key, effects.id)


def run_dedup(config: TopicConfig, producer: Producer) -> tuple[Progress, str]:
    """The dedup bolt over MESSAGES messages of partition 0; its progress and counting key."""
    produce(producer, config.topic, {0: range(MESSAGES)}, key=id_of)
    key = f"{config.topic}:applied"
    with Driver(config, LocalExecutor(config, IdempotencyBolt(Count(key), config))) as driver:
        return driver.run(until_caught_up=True), key


def test_the_dedup_store_logs_in_as_an_acl_user_with_a_password_file(
    acl_redis: RedisServer,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    tmp_path: Path,
) -> None:
    password = secret_file(tmp_path / "redis-password", REDIS_PASSWORD)
    config = make_config(
        redis={"url": acl_redis.url, "username": REDIS_USER, "password_file": str(password)}
    )

    progress, key = run_dedup(config, producer)

    assert progress.total("acked") == MESSAGES
    check = redis.Redis.from_url(acl_redis.url, username=REDIS_USER, password=REDIS_PASSWORD)
    try:
        assert len(check.hgetall(key)) == MESSAGES
    finally:
        check.close()


@pytest.mark.parametrize(
    ("login", "error"),
    [
        # redis-py's words (RESP3): "HELLO must be called with the client already authenticated"
        ({}, "authenticated"),
        ({"username": REDIS_USER, "password_env": "T_REDIS_PASSWORD"}, "invalid username-password"),
    ],
    ids=["no-credentials", "wrong-password"],
)
def test_the_dedup_bolt_without_the_redis_credentials_fails_at_start(
    acl_redis: RedisServer,
    make_config: Callable[..., TopicConfig],
    monkeypatch: pytest.MonkeyPatch,
    login: dict[str, str],
    error: str,
) -> None:
    monkeypatch.setenv("T_REDIS_PASSWORD", REDIS_PASSWORD + "-wrong")
    config = make_config(redis={"url": acl_redis.url, **login})
    bolt = IdempotencyBolt(Count("unused"), config)
    with pytest.raises(RedisLoginRefused, match=error) as caught:
        bolt.start()
    assert REDIS_PASSWORD not in str(caught.value)
    user = login.get("username", "default")
    assert f"refused the login of user {user!r}" in str(caught.value)
    assert "`redis.username`" in str(caught.value)  # the key to fix


# -- Redis over TLS ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A throwaway CA, a certificate for 127.0.0.1 and a client certificate, as PEM files."""
    home = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert(LOOPBACK, "localhost")
    client = ca.issue_cert("kspout-client")
    files = TlsFiles(*(home / name for name in ("ca.pem", "s.pem", "s.key", "c.pem", "c.key")))
    ca.cert_pem.write_to_path(str(files.ca))
    pairs = [
        (server, files.server_cert, files.server_key),
        (client, files.client_cert, files.client_key),
    ]
    for leaf, cert, key in pairs:
        leaf.private_key_pem.write_to_path(str(key))
        for i, pem in enumerate(leaf.cert_chain_pems):
            pem.write_to_path(str(cert), append=i > 0)
    return files


class TlsRedisServer(RedisServer):
    """The dev stack's `redis-server` handle, serving TLS only on its port and asking clients
    for a certificate (`tls-auth-clients yes`, Redis's default)."""

    def __init__(self, workdir: Path, files: TlsFiles) -> None:
        super().__init__(workdir)
        self.files = files

    @property
    def url(self) -> str:
        return f"rediss://{self.address}/0"

    def _command(self) -> list[str]:
        # The port the handle picked serves TLS; the later `--port 0` closes the plain one.
        return [
            *super()._command(),
            *("--tls-port", str(self.port), "--port", "0"),
            *("--tls-cert-file", str(self.files.server_cert)),
            *("--tls-key-file", str(self.files.server_key)),
            *("--tls-ca-cert-file", str(self.files.ca)),
        ]

    def _ready(self) -> bool:
        client = redis.Redis.from_url(
            self.url,
            ssl_ca_certs=str(self.files.ca),
            ssl_certfile=str(self.files.client_cert),
            ssl_keyfile=str(self.files.client_key),
            socket_timeout=1.0,
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


# What a redis-server built without TLS prints for `--tls-port`: the tls-* directives exist only
# in a build with TLS (`#ifdef USE_OPENSSL` in Redis's config.c), so the first one is unknown.
# deploy/setup.sh installs Debian's redis-server, which is built with TLS (it links libssl).
NO_TLS_BUILD = re.compile(r">>> 'tls-port [^\n]*\nBad directive or wrong number of arguments")


@pytest.fixture
def tls_redis(tmp_path: Path, tls_files: TlsFiles) -> Iterator[TlsRedisServer]:
    """A TLS-only Redis server of this test's own. A server that does not start fails the
    test (a timeout, a bad certificate, a port taken); only a build that does not know the
    `tls-port` directive at all skips it."""
    server = TlsRedisServer(tmp_path, tls_files)
    try:
        server.start()
    except StackError as exc:
        if NO_TLS_BUILD.search(str(exc)):
            pytest.skip(f"this redis-server was built without TLS support: {exc}")
        raise
    yield server
    server.stop()


def test_a_tls_server_that_does_not_start_fails_the_fixture_rather_than_skipping(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    broken = replace(tls_files, server_cert=tmp_path / "missing.pem")  # a bad certificate
    with pytest.raises(StackError) as failed:
        TlsRedisServer(tmp_path, broken).start()
    # The words "tls" are all over this error (the old test skipped on them): not a skip.
    assert "tls" in str(failed.value).lower()
    assert not NO_TLS_BUILD.search(str(failed.value)), str(failed.value)


def tls_settings(server: TlsRedisServer, *, rediss: bool, **files: Path) -> dict[str, Any]:
    """`[redis]` for the server: TLS by a rediss:// url, or by `ssl = true` on a redis:// one."""
    url = server.url if rediss else server.url.replace("rediss://", "redis://")
    settings: dict[str, Any] = {"url": url, **{key: str(path) for key, path in files.items()}}
    if not rediss:
        settings["ssl"] = True
    return settings


@pytest.mark.parametrize("rediss", [True, False], ids=["rediss-url", "ssl-true"])
def test_the_dedup_store_works_over_tls_with_a_client_certificate(
    tls_redis: TlsRedisServer,
    tls_files: TlsFiles,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    rediss: bool,
) -> None:
    files = {
        "ssl_ca_certs": tls_files.ca,
        "ssl_certfile": tls_files.client_cert,
        "ssl_keyfile": tls_files.client_key,
    }
    config = make_config(redis=tls_settings(tls_redis, rediss=rediss, **files))

    progress, key = run_dedup(config, producer)

    assert progress.total("acked") == MESSAGES
    check = redis.Redis.from_url(**config.redis_args())
    try:
        assert len(check.hgetall(key)) == MESSAGES
    finally:
        check.close()


@pytest.mark.parametrize(
    ("missing", "error"),
    [
        ("ssl_ca_certs", "certificate verify failed"),  # the server's certificate is unknown
        ("ssl_certfile", None),  # the server refuses a client without a certificate
    ],
)
def test_tls_without_the_ca_or_the_client_certificate_fails(
    tls_redis: TlsRedisServer,
    tls_files: TlsFiles,
    make_config: Callable[..., TopicConfig],
    missing: str,
    error: str | None,
) -> None:
    files = {
        "ssl_ca_certs": tls_files.ca,
        "ssl_certfile": tls_files.client_cert,
        "ssl_keyfile": tls_files.client_key,
    }
    del files[missing]
    if missing == "ssl_certfile":
        del files["ssl_keyfile"]
    config = make_config(redis=tls_settings(tls_redis, rediss=True, **files))
    with pytest.raises(RedisTlsRefused, match=error) as caught:
        IdempotencyBolt(Count("unused"), config).start()
    assert f"`redis.{missing}`" in str(caught.value)  # the key to fix


# -- no secret in kspout's output ----------------------------------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`kspout -vv` sets the root logger to DEBUG with its own handler; put it back after."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.mark.usefixtures("restore_logging")
def test_kspout_commands_print_no_secret_even_at_debug_level(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(MESSAGES) for p in PARTITIONS})
    zk = secret_file(tmp_path / "zk", f"kspout:{ZK_PASSWORD}")
    sasl = secret_file(tmp_path / "sasl", SASL_PASSWORD)
    toml = tmp_path / "topic.toml"
    toml.write_text(
        f"""\
topic = "{config.topic}"
spout_id = "{config.spout_id}"
zk_root = "{own_zk_root()}"
brokers = "{stack.info.brokers}"
zookeeper = "{stack.info.zookeeper}"
commit_interval = 0.2

[kafka]
"sasl.password_file" = "{sasl}"
"ssl.key.password_env" = "T_KEY_PASSWORD"

[zookeeper_auth]
credential_file = "{zk}"

[redis]
url = "{stack.info.redis_url}"
username = "{REDIS_USER}"
password_env = "T_REDIS_PASSWORD"
"""
    )
    runner = CliRunner()
    # Wide lines: a log message wrapped across two lines could split a secret in the output.
    env = {"COLUMNS": "500", "T_KEY_PASSWORD": KEY_PASSWORD, "T_REDIS_PASSWORD": REDIS_PASSWORD}

    def kspout(*args: str) -> Any:
        result = runner.invoke(main, ["-vv", *args, "--config", str(toml)], env=env)
        assert result.exit_code == 0, result.output
        return result

    handler = f"{__name__}:{ignore.__name__}"
    ran = kspout("run", "--handler", handler, "--until-caught-up", "--json")
    shown = kspout("offsets", "show", "--json")
    table = kspout("offsets", "show")

    assert json.loads(ran.stdout)["lag"] == 0
    rows = json.loads(shown.stdout)["partitions"]
    assert [row["stored_offset"] for row in rows] == [MESSAGES] * len(PARTITIONS)
    for result in (ran, shown, table):
        printed = result.output + result.stderr
        assert "Sending request" in printed  # kazoo's debug log, its Auth request included
        unwrapped = "".join(printed.split())
        assert not [secret for secret in SECRETS if secret in unwrapped]
