"""Per-topic configuration: one TOML file per topic, loaded into frozen, validated settings.

`load_config(path)` is the only way in. Every problem is a `ConfigError` naming the file, the
key and what is allowed, in kspout's words: values are strict (`batch_size = "100"` or `= true`
is refused, not coerced; an integer is fine where a number is), and an unknown key or table
gets the nearest known one ("did you mean"). Connection settings may be overridden from the
environment (`KSPOUT_BROKERS`, `KSPOUT_ZOOKEEPER`, `KSPOUT_REDIS_URL`), so one file serves every
stage; `TopicConfig.origin` says where each came from, for the errors of a server that does not
answer. Converters at the bottom turn the settings into each client's own dialect.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from kazoo.security import make_digest_acl
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from kspout import secrets
from kspout.errors import ConfigError
from kspout.policy import (
    Backoff,
    BehindPolicy,
    ExhaustedPolicy,
    PartitionPolicy,
    Position,
    PositionKind,
)

ENV_OVERRIDES = {
    "KSPOUT_BROKERS": "brokers",
    "KSPOUT_ZOOKEEPER": "zookeeper",
}
ENV_REDIS_URL = "KSPOUT_REDIS_URL"
# The connection settings, by dotted key, with the environment variable that overrides each.
CONNECTIONS = {
    "brokers": "KSPOUT_BROKERS",
    "zookeeper": "KSPOUT_ZOOKEEPER",
    "redis.url": ENV_REDIS_URL,
}


def _start_position(value: object) -> Position:
    """`start` from the file: a Position, or its text form."""
    return value if isinstance(value, Position) else Position.parse(str(value), allow_fail=False)


def _out_of_range_position(value: object) -> Position:
    """`out_of_range` from the file: a Position, or its text form (`fail` allowed)."""
    return value if isinstance(value, Position) else Position.parse(str(value), allow_fail=True)


def _retry_limit(value: object) -> object:
    """`max_retries` from the file: an integer >= 0, or "unlimited" (never exhausted)."""
    if value == "unlimited" or (type(value) is int and value >= 0):
        return value
    raise ValueError('must be an integer >= 0, or "unlimited" to retry for ever')


class _Section(BaseModel):
    # strict: no coercion of strings or booleans into numbers (an int is still a float).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class RetryBackoff(_Section):
    """`[retry_backoff]`, `[infra_backoff]`: wait n is `initial * multiplier**(n-1)`, <= `max`."""

    initial: float = Field(0.5, ge=0)
    multiplier: float = Field(2.0, ge=1)
    max: float = Field(60.0, ge=0)


class ZooKeeperAuth(_Section):
    """`[zookeeper_auth]`: the digest credential kspout logs in with. Every znode kspout creates
    then carries a creator-only ACL: all rights for this user, none for anyone else.

    The credential, "user:password", is given as `credential`, `credential_file` or
    `credential_env`: exactly one of them (`kspout.secrets`).
    """

    scheme: Literal["digest"] = "digest"
    credential: SecretStr  # "user:password"

    @model_validator(mode="before")
    @classmethod
    def _credential(cls, data: Any) -> Any:
        data = secrets.resolve(data, "credential", required=True)
        if isinstance(data, dict):
            value = data["credential"]
            text = value.get_secret_value() if isinstance(value, SecretStr) else value
            user, colon, password = text.partition(":")
            if not (user and colon and password):
                raise ValueError('credential must be "user:password", neither part empty')
        return data


class RedisSettings(_Section):
    """`[redis]`: where the dedup bolt keeps its idempotency records, and how it logs in.

    `username` is a Redis ACL user (absent: `default`); the password is given as `password`,
    `password_file` or `password_env`, at most one of them (`kspout.secrets`), and never in
    the URL, which is logged. TLS is on with `ssl = true` or a `rediss://` URL: the server's
    certificate is checked against `ssl_ca_certs` (absent: the system's CAs), and
    `ssl_certfile`/`ssl_keyfile` are the client certificate a server with `tls-auth-clients`
    asks for. `cluster = true`: `url` names one node of a Redis Cluster (the client finds the
    others), and the dedup records are sharded per Kafka partition (`dedup.store`).
    """

    url: str = "redis://127.0.0.1:6379/0"  # redis://, rediss:// (TLS) or unix://
    cluster: bool = False  # url is a node of a Redis Cluster
    username: str | None = None
    password: SecretStr | None = None
    ssl: bool = False
    ssl_ca_certs: str | None = None  # PEM file: the CAs that signed the server's certificate
    ssl_certfile: str | None = None  # PEM file: the client certificate (and maybe its key)
    ssl_keyfile: str | None = None  # PEM file: the client certificate's private key

    @model_validator(mode="before")
    @classmethod
    def _password(cls, data: Any) -> Any:
        return secrets.resolve(data, "password")

    @field_validator("cluster")
    @classmethod
    def _cluster_url(cls, cluster: bool, info: ValidationInfo) -> bool:
        url = urlsplit(info.data.get("url", ""))
        if cluster and (url.scheme == "unix" or url.path.strip("/") not in ("", "0")):
            raise ValueError(
                "true or false; true needs a redis:// or rediss:// url naming one node of the "
                "cluster, with database 0 (a Redis Cluster has no other), e.g. "
                "redis://10.0.0.1:7000/0"
            )
        return cluster

    @model_validator(mode="after")
    def _url_and_tls(self) -> RedisSettings:
        # Errors here never echo the URL: it may hold a password.
        url = urlsplit(self.url)
        if url.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("url must start with redis://, rediss:// (TLS) or unix://")
        if url.password:
            raise ValueError(
                "the url holds a password, and urls are logged: give it as password, "
                "password_file or password_env instead"
            )
        if self.ssl and url.scheme == "unix":
            raise ValueError("ssl = true needs a redis:// or rediss:// url, not unix://")
        files = [k for k in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile") if getattr(self, k)]
        if files and not self.tls:
            raise ValueError(f"{', '.join(files)}: TLS only; set ssl = true or use a rediss:// url")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("ssl_keyfile needs ssl_certfile, the certificate the key belongs to")
        return self

    @property
    def tls(self) -> bool:
        """True when connections use TLS: `ssl = true` or a `rediss://` URL."""
        return self.ssl or self.url.startswith("rediss://")


class DedupSettings(_Section):
    """`[dedup]`: where a message's id comes from and how long records live."""

    id_source: str = "key"  # key | header:<name> | json:<field>
    ttl: float = Field(86400.0, gt=0)  # seconds a DONE record is kept (the dedup window)
    lease: float = Field(60.0, gt=0)  # seconds a lease holds a message id before a new one
    # replicas that must acknowledge each settlement (WAIT) before its messages are acked
    wait_replicas: int = Field(0, ge=0)
    wait_timeout: float = Field(1.0, gt=0)  # seconds to wait for them; short: released, retried
    wait_aof: bool = False  # WAITAOF (Redis >= 7.2): fsynced locally and by wait_replicas

    @field_validator("id_source")
    @classmethod
    def _id_source(cls, value: str) -> str:
        kind, _, name = value.partition(":")
        if value == "key" or (kind in ("header", "json") and name):
            return value
        raise ValueError("must be key, header:<name> or json:<field>")


class MetricsSettings(_Section):
    """`[metrics]`: the Prometheus endpoint the driver serves while it runs."""

    port: int = Field(ge=0, le=65535)  # 0: any free port (the driver logs which)
    host: str = "0.0.0.0"


class TopicConfig(_Section):
    """Everything kspout needs to consume one topic. See deploy/topics/ for annotated examples."""

    topic: str = Field(min_length=1)
    spout_id: str = Field(min_length=1)
    topology_name: str = "kspout"
    zk_root: str = "/kspout"
    brokers: str = "127.0.0.1:9092"
    zookeeper: str = "127.0.0.1:2181"

    start: Annotated[Position, BeforeValidator(_start_position)] = Position(PositionKind.EARLIEST)
    out_of_range: Annotated[Position, BeforeValidator(_out_of_range_position)] = Position(
        PositionKind.EARLIEST
    )
    max_offset_behind: int | None = Field(None, gt=0)
    behind_policy: Literal["retry", "dead_letter", "skip"] = "retry"
    max_retries: Annotated[int | Literal["unlimited"], BeforeValidator(_retry_limit)] = 5
    on_retries_exhausted: Literal["dead_letter", "skip"] = "dead_letter"
    retry_backoff: RetryBackoff = RetryBackoff()
    # Waits of a partition's circuit breaker while a dependency (Kafka, Redis, ZooKeeper) is down.
    infra_backoff: RetryBackoff = RetryBackoff(initial=1.0, multiplier=2.0, max=30.0)
    message_timeout: float = Field(30.0, gt=0)
    defer_delay: float = Field(1.0, gt=0)  # seconds before a DEFERRED message is offered again
    max_uncommitted: int | None = Field(PartitionPolicy().max_uncommitted, gt=0)
    batch_size: int = Field(10_000, gt=0)
    max_batches_in_flight: int = Field(2, gt=0)
    # none: Storm's semantics (batches of a partition overlap, retries reorder); key: a record
    # waits while an earlier record with its key is unfinished (kspout.ordering).
    ordering: Literal["none", "key"] = "none"
    max_tasks_per_partition: int = Field(1, gt=0)  # with ordering = key: split by key hash
    commit_interval: float = Field(5.0, gt=0)
    fetch_timeout: float = Field(30.0, gt=0)
    dead_letter_topic: str | None = None
    # Several instances share a spout id: how long ZooKeeper waits for a silent one before its
    # partitions move (its session), and how often the topic is checked for added partitions.
    zk_session_timeout: float = Field(10.0, ge=2, le=120)
    partition_refresh: float = Field(10.0, gt=0)
    metrics: MetricsSettings | None = None  # absent: no Prometheus endpoint
    # Also commit the commit point to this Kafka consumer group, for standard lag tools.
    consumer_group: str | None = Field(None, min_length=1)

    # librdkafka pass-through; may hold SASL/SSL secrets, so it never appears in repr or errors.
    # A setting can also be read from a file or the environment when the file is loaded:
    # "sasl.password_file" = "<path>" or "sasl.password_env" = "<variable>" (kspout.secrets).
    kafka: Annotated[
        dict[str, str | int | float | bool | SecretStr], BeforeValidator(secrets.resolve_all)
    ] = Field(default_factory=dict, repr=False)
    zookeeper_auth: ZooKeeperAuth | None = None
    redis: RedisSettings = RedisSettings()
    dedup: DedupSettings = DedupSettings()

    # Set by `parse_config`: the file read, and where each connection setting came from
    # (`CONNECTIONS` key -> the file or the variable; absent: the default).
    _path: str = PrivateAttr("<config>")
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @field_validator("spout_id")
    @classmethod
    def _spout_id(cls, value: str) -> str:
        if "/" in value:
            raise ValueError("must not contain '/': it names one ZooKeeper node under zk_root")
        return value

    @field_validator("zk_root")
    @classmethod
    def _zk_root(cls, value: str) -> str:
        if not value.startswith("/") or value.endswith("/"):
            raise ValueError(
                "must be a ZooKeeper path that starts with '/' and does not end with it, "
                "e.g. /kspout"
            )
        return value

    @field_validator("kafka")
    @classmethod
    def _kafka(cls, value: dict[str, Any]) -> dict[str, Any]:
        owned = {"bootstrap.servers", "enable.auto.commit", "group.id", "auto.offset.reset"}
        clash = sorted(owned & value.keys())
        if clash:
            raise ValueError(
                f"{', '.join(clash)} cannot be set here: kspout sets it (use `brokers` for "
                "bootstrap.servers)"
            )
        return value

    @model_validator(mode="after")
    def _dlq_differs(self) -> TopicConfig:
        if self.dead_letter_topic == self.topic:
            raise ValueError("dead_letter_topic must differ from topic")
        return self

    @field_validator("max_tasks_per_partition")
    @classmethod
    def _split_needs_key_order(cls, value: int, info: ValidationInfo) -> int:
        if value > 1 and info.data.get("ordering") != "key":
            raise ValueError(
                'a value > 1 splits a partition by key hash and needs ordering = "key" '
                '(with ordering = "none", raise max_batches_in_flight instead); allowed: 1'
            )
        return value

    # -- derived values ---------------------------------------------------------------------

    def origin(self, key: str) -> str:
        """Where the connection setting `key` (a `CONNECTIONS` key) came from, for a message
        that asks to fix it: `brokers` in the file, its variable, or the default."""
        env, source = CONNECTIONS[key], self._origins.get(key)
        if source == env:
            return f"`{key}` from the environment variable {env} (it overrides {self.path})"
        if source is not None:
            return f"`{key}` in {source} (or the environment variable {env})"
        return f"`{key}`, not set in {self.path}: the default (set it there or in {env})"

    @property
    def path(self) -> str:
        """The topic file this config was read from (`<config>`: built from a table)."""
        return self._path

    @property
    def dlq_topic(self) -> str:
        """The dead-letter topic: `dead_letter_topic`, or `<topic>.dlq`."""
        return self.dead_letter_topic or f"{self.topic}.dlq"

    @property
    def zk_spout_path(self) -> str:
        """`<zk_root>/<spout_id>`: the parent of storm-kafka's `partition_<n>` records."""
        return f"{self.zk_root.rstrip('/')}/{self.spout_id}"

    def partition_policy(self) -> PartitionPolicy:
        """The PartitionManager's view of this file."""
        b = self.retry_backoff
        return PartitionPolicy(
            max_retries=self.max_retries if isinstance(self.max_retries, int) else None,
            backoff=Backoff(b.initial, b.multiplier, b.max),
            on_exhausted=ExhaustedPolicy(self.on_retries_exhausted),
            max_offset_behind=self.max_offset_behind,
            behind_policy=BehindPolicy(self.behind_policy),
            message_timeout=self.message_timeout,
            max_uncommitted=self.max_uncommitted,
            out_of_range=self.out_of_range,
            defer_delay=self.defer_delay,
        )

    def kafka_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings: brokers plus the `[kafka]` pass-through (security, tuning), with
        the secrets read from files and the environment in clear (for the client only)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.brokers}
        for key, value in self.kafka.items():
            conf[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        conf.update(extra)
        return conf

    def kazoo_args(self) -> dict[str, Any]:
        """Keyword arguments for `kazoo.client.KazooClient`. With `[zookeeper_auth]`: the digest
        credential, and a creator-only `default_acl`, which kazoo gives every node it creates
        without an explicit ACL (parents made by `makepath`/`ensure_path` and transactions
        included), so kspout's whole tree is closed to other clients."""
        args: dict[str, Any] = {"hosts": self.zookeeper}
        if self.zookeeper_auth is not None:
            cred = self.zookeeper_auth.credential.get_secret_value()
            user, _, password = cred.partition(":")
            args["auth_data"] = [(self.zookeeper_auth.scheme, cred)]
            args["default_acl"] = [make_digest_acl(user, password, all=True)]
            secrets.hide_kazoo_auth()  # kazoo logs the credential at DEBUG otherwise
        return args

    def redis_args(self) -> dict[str, Any]:
        """Keyword arguments for `redis.Redis.from_url`: the ACL user and password, and with TLS
        a `rediss://` URL (redis-py picks TLS by the scheme alone) and the certificate files."""
        settings = self.redis
        url = settings.url
        if settings.ssl and url.startswith("redis://"):
            url = "rediss://" + url.removeprefix("redis://")
        args: dict[str, Any] = {"url": url}
        if settings.username:
            args["username"] = settings.username
        if settings.password is not None:
            args["password"] = settings.password.get_secret_value()
        tls_files = {
            "ssl_ca_certs": settings.ssl_ca_certs,
            "ssl_certfile": settings.ssl_certfile,
            "ssl_keyfile": settings.ssl_keyfile,
        }
        args.update({key: path for key, path in tls_files.items() if path is not None})
        return args


# What a value of the wrong type must be, by pydantic's error type.
_TYPES = {
    "int_type": "must be an integer (a whole number, not in quotes)",
    "float_type": "must be a number (not in quotes)",
    "bool_type": "must be true or false (not in quotes)",
    "string_type": "must be a string (in quotes)",
    "model_type": "must be a table",
    "dict_type": "must be a table",
}
# Bounds on a number, by pydantic's error type: (its context key, how to say it).
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "greater than or equal to"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _section(loc: list[str]) -> type[BaseModel]:
    """The model of the table that holds the key at `loc`."""
    model: type[BaseModel] = TopicConfig
    for part in loc[:-1]:
        annotation = model.model_fields[part].annotation
        nested = [a for a in getattr(annotation, "__args__", (annotation,)) if a]
        model = next(a for a in nested if isinstance(a, type) and issubclass(a, BaseModel))
    return model


def _unknown(loc: list[str], table: bool) -> str:
    """An unknown key or table: the nearest known one ("did you mean"), and every allowed."""
    allowed = sorted(_section(loc).model_fields)
    section = f"[{'.'.join(loc[:-1])}]" if loc[:-1] else "top-level"
    close = difflib.get_close_matches(loc[-1], allowed, n=1)
    if table:
        said = f"unknown table [{'.'.join(loc)}]"
        guess = f"[{'.'.join([*loc[:-1], close[0]])}]" if close else ""
    else:
        said, guess = "unknown key", f"`{close[0]}`" if close else ""
    hint = f"; did you mean {guess}?" if guess else ""
    return f"{said}{hint} (allowed {section} keys: {', '.join(allowed)})"


def _shown(value: object) -> str:
    """A value as the file wrote it: true, "text", 12."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _describe(error: ErrorDetails) -> tuple[str, str]:
    """Turn one pydantic error into (dotted key, message naming what is allowed), in kspout's
    words: pydantic's own wording ("Input should be ...") never reaches the user."""
    loc = [str(part) for part in error["loc"]]
    if loc[0] == "kafka":
        loc = loc[:2]  # past the key: pydantic's names of the union's types
    key, kind, value = ".".join(loc), error["type"], error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return key, _unknown(loc, isinstance(value, dict))
    if kind == "missing":
        return key, "required key is missing"
    if loc[0] == "kafka" and kind != "value_error":
        return key, "must be a string, a number or true/false"  # never echoed: may be secret
    if kind in _TYPES:
        message = _TYPES[kind]
    elif kind in _BOUNDS:
        name, words = _BOUNDS[kind]
        message = f"must be {words} {ctx[name]}"
    elif kind == "literal_error":
        message = f"must be one of {ctx['expected']}"
    elif kind == "string_too_short":
        message = "must not be empty"
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
    if "got " in message or isinstance(value, dict) or loc[0] == "kafka":
        return key, message  # a table's contents may hold secrets: never echo them
    return key, f"{message} (got {_shown(value)})"


def parse_config(data: dict[str, Any], path: str = "<config>") -> TopicConfig:
    """Validate an already-parsed TOML table (env overrides applied) into a TopicConfig."""
    data = dict(data)
    origins: dict[str, str] = {key: path for key in ("brokers", "zookeeper") if key in data}
    redis = data.get("redis", {})
    if isinstance(redis, dict) and "url" in redis:
        origins["redis.url"] = path
    for env, key in ENV_OVERRIDES.items():
        if os.environ.get(env):
            data[key] = os.environ[env]
            origins[key] = env
    if os.environ.get(ENV_REDIS_URL) and isinstance(redis, dict):
        data["redis"] = {**redis, "url": os.environ[ENV_REDIS_URL]}
        origins["redis.url"] = ENV_REDIS_URL
    try:
        config = TopicConfig.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(error) for error in exc.errors()]
        key, message = problems[0]
        more = len({key for key, _ in problems}) - 1  # a union's types err apart: one problem
        if more:
            message += f" (and {more} more problem{'s' if more > 1 else ''})"
        raise ConfigError(path, key, message) from None
    config._path, config._origins = path, origins
    return config


def load_config(path: str | os.PathLike[str]) -> TopicConfig:
    """Read and validate one topic file; every failure names the file, key and allowed values."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(str(p), None, f"cannot read the file ({exc.strerror})") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(str(p), None, f"not valid TOML: {exc}") from None
    return parse_config(data, str(p))
