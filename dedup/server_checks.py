"""Checks of a Redis server's settings: WAITAOF there, and settings that could lose records."""

from __future__ import annotations

import redis

from dedup.errors import WaitAofUnsupported
from dedup.records import text


def require_wait_aof(client: redis.Redis) -> None:
    """`WaitAofUnsupported` unless the server runs WAITAOF (Redis >= 7.2, not renamed or
    denied): tried with nothing to wait for."""
    try:
        client.waitaof(0, 0, 1)
    except redis.ResponseError as exc:
        version = client.info("server")["redis_version"]
        raise WaitAofUnsupported(f"{version}; WAITAOF answered: {exc}") from exc


def server_durability_warnings(client: redis.Redis) -> list[str]:
    """Warnings about server settings under which Redis could lose acknowledged records (a lost
    DONE record lets its message run again); empty if none apply.

    Checks `appendonly` (must be yes), `appendfsync` (`no` leaves flushing to the OS; `everysec`,
    the usual choice, can lose about one second of writes on a machine crash, not on a Redis
    crash) and `maxmemory-policy` (only `noeviction` is safe: DONE records have a TTL, so even
    the `volatile-*` policies may evict them). If CONFIG is disabled or denied, one warning says
    what to check by hand.
    """
    try:
        raw = client.config_get("appendonly", "appendfsync", "maxmemory-policy")
    except redis.ResponseError as exc:  # renamed/disabled command or ACL NOPERM
        return [
            f"cannot read the Redis configuration (CONFIG GET failed: {exc}); check by hand "
            "that the server runs with appendonly yes, appendfsync everysec or always, and "
            "maxmemory-policy noeviction"
        ]
    config = {text(k): text(v) for k, v in raw.items()}
    warnings = []
    if config.get("appendonly") != "yes":
        warnings.append(
            "appendonly is no: a Redis restart loses every record written since the last "
            "snapshot, so DONE messages run again, and a restart from a snapshot brings back "
            "an old token counter, so tokens can repeat; set appendonly yes (CONFIG SET "
            "appendonly yes, and in redis.conf)"
        )
    elif config.get("appendfsync") == "no":
        warnings.append(
            "appendfsync is no: the OS writes the append-only file when it likes (often 30 s), "
            "and a machine crash loses that much; set appendfsync everysec or always"
        )
    policy = config.get("maxmemory-policy")
    if policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is {policy}: at maxmemory Redis evicts keys; DONE and FAILED "
            "records carry a TTL, so even volatile-* policies evict DONE records and their "
            "messages run again (allkeys-* also evict leases in flight); set "
            "maxmemory-policy noeviction (writes then fail loudly when memory is full)"
        )
    return warnings
