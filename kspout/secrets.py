"""Secrets in a topic file: written inline, read from a file, or taken from the environment.

Every secret key `<key>` has three spellings, and a table may use exactly one of them::

    password = "..."                          # inline: keep the topic file itself private
    password_file = "/run/secrets/redis"      # a file's contents, one trailing newline stripped
    password_env = "KSPOUT_REDIS_PASSWORD"    # an environment variable's value

The secrets are `[zookeeper_auth] credential`, `[redis] password` and any librdkafka setting in
`[kafka]` (`"sasl.password_file" = ...`). Files and variables are read once, when the topic
file is loaded, so the value travels with the config to Spark's workers, which need neither.
Errors name the key, the file or the variable, never the value; kazoo's debug log of its
authentication request is redacted (`hide_kazoo_auth`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kazoo.protocol.serialization import Auth
from pydantic import SecretStr

FILE = "_file"
ENV = "_env"
HIDDEN = "<hidden>"


def resolve(table: Any, key: str, *, required: bool = False) -> Any:
    """`table` with the secret `key` in place, read from `<key>_file` or `<key>_env` when
    written so (that spelling removed). ValueError if it is written more than one way, if a
    `required` secret is missing, or if an inline value is not a string. Anything but a mapping
    is returned as it is, for pydantic to refuse."""
    if not isinstance(table, Mapping):
        return table
    out = _resolve_one(dict(table), key)
    value = out.get(key)
    if value is None and required:
        raise ValueError(f"{key} is required: give one of {_spellings(key)}")
    if value is not None and not isinstance(value, str | SecretStr):
        raise ValueError(f"{key} must be a string (in quotes)")
    return out


def resolve_all(table: Any) -> Any:
    """`table` with every `<key>_file` / `<key>_env` entry replaced by `<key>` and the secret
    it points to (for `[kafka]`, where any librdkafka setting may be a secret)."""
    if not isinstance(table, Mapping):
        return table
    out = dict(table)
    keys = {k.removesuffix(s) for k in table for s in (FILE, ENV) if k.endswith(s) and k != s}
    for key in sorted(keys):
        out = _resolve_one(out, key)
    return out


def _resolve_one(table: dict[str, Any], key: str) -> dict[str, Any]:
    given = [k for k in (key, key + FILE, key + ENV) if table.get(k) is not None]
    if len(given) > 1:
        raise ValueError(
            f"{key} is given {len(given)} times ({', '.join(given)}): give one of {_spellings(key)}"
        )
    if given and given[0] != key:
        spelling = given[0]
        source = table.pop(spelling)
        read = read_file if spelling.endswith(FILE) else read_env
        table[key] = read(spelling, source)
    return table


def read_file(spelling: str, path: object) -> SecretStr:
    """The secret in the file `path` (UTF-8, one trailing newline stripped: what `echo` and
    most secret mounts leave); ValueError naming `spelling` and the path, never the contents."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{spelling} must be the path of a file holding the secret")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{spelling}: cannot read {path} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{spelling}: {path} is not UTF-8 text") from None
    value = text.removesuffix("\n").removesuffix("\r")
    if not value:
        raise ValueError(f"{spelling}: {path} is empty")
    return SecretStr(value)


def read_env(spelling: str, name: object) -> SecretStr:
    """The secret in the environment variable `name`; ValueError naming `spelling` and the
    variable when it is unset or empty."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{spelling} must be the name of an environment variable")
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"{spelling}: the environment variable {name} is not set")
    if not value:
        raise ValueError(f"{spelling}: the environment variable {name} is empty")
    return SecretStr(value)


def _spellings(key: str) -> str:
    return f"{key}, {key}{FILE} or {key}{ENV}"


class _HideAuth(logging.Filter):
    """Redacts the credential of kazoo's `Auth` request, which kazoo logs at DEBUG
    ("Sending request(xid=-4): Auth(auth_type=0, scheme='digest', auth='user:password')")."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, Auth) for a in args):
            record.args = tuple(a._replace(auth=HIDDEN) if isinstance(a, Auth) else a for a in args)
        return True


_HIDE_AUTH = _HideAuth()


def hide_kazoo_auth() -> None:
    """Keep ZooKeeper credentials out of kazoo's debug log (`kspout -vv` prints it). Idempotent;
    covers every KazooClient that logs through kazoo's own logger, as kspout's do."""
    logging.getLogger("kazoo.client").addFilter(_HIDE_AUTH)
