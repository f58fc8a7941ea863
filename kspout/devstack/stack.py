"""`DevStack`: the embedded Kafka (Apache Kafka's broker), ZooKeeper and Redis, started
together, and a PostgreSQL server started only when asked for."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from kspout.devstack.components import (
    START_TIMEOUT,
    Component,
    PostgresServer,
    RedisServer,
    ZooKeeperServer,
)
from kspout.devstack.kafka_broker import KafkaBroker
from kspout.devstack.processes import GRACE
from kspout.devstack.state import COMPONENTS, StackInfo, StackState
from kspout.errors import StackError
from kspout.lifecycle import Lifecycle

C = TypeVar("C", bound=Component)


class DevStack(Lifecycle):
    """The servers demos and integration tests run against, under `workdir`.

    `start()` starts the chosen components in order (stopping the started ones if one fails);
    `stop()` stops them in reverse. The handles (`kafka`, `zookeeper`, `redis`) can also stop,
    kill and restart one server, for failure tests.

    `postgres` (for the fenced SQL sink) is not among the components: `start()` leaves it alone,
    since most users of the stack never need it. `postgres.start()` starts it on demand; `stop()`
    stops it and deletes its data, so each stack gets a fresh data directory.
    """

    def __init__(
        self,
        workdir: Path,
        components: Iterable[str] = COMPONENTS,
        *,
        path: str | None = None,
        start_timeout: float = START_TIMEOUT,
        appendonly: bool = True,
    ) -> None:
        chosen = set(components)
        unknown = chosen.difference(COMPONENTS)
        if unknown:
            raise StackError(
                f"unknown components {sorted(unknown)}; choose from {', '.join(COMPONENTS)}"
            )
        self.workdir = workdir
        made: dict[str, Component] = {
            "kafka": KafkaBroker(workdir, path=path, start_timeout=start_timeout),
            "zookeeper": ZooKeeperServer(workdir, path=path, start_timeout=start_timeout),
            "redis": RedisServer(
                workdir, path=path, start_timeout=start_timeout, appendonly=appendonly
            ),
        }
        self.components = {name: made[name] for name in COMPONENTS if name in chosen}
        self.postgres = PostgresServer(workdir, path=path, start_timeout=start_timeout)

    @property
    def kafka(self) -> KafkaBroker:
        return self._get(KafkaBroker)

    @property
    def zookeeper(self) -> ZooKeeperServer:
        return self._get(ZooKeeperServer)

    @property
    def redis(self) -> RedisServer:
        return self._get(RedisServer)

    @property
    def info(self) -> StackInfo:
        """Addresses of the started components ("" for those not in this stack)."""
        parts = self.components
        return StackInfo(
            brokers=self.kafka.address if "kafka" in parts else "",
            zookeeper=self.zookeeper.address if "zookeeper" in parts else "",
            redis_url=self.redis.url if "redis" in parts else "",
        )

    def state(self) -> StackState:
        """What `stack.json` records, for finding the servers from another process."""
        return StackState(
            info=self.info,
            components={name: c.state() for name, c in self.components.items()},
        )

    def start(self) -> None:
        """Start every component; if one fails, stop those already started and re-raise."""
        try:
            for component in self.components.values():
                component.start()
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = GRACE) -> None:
        """Stop every component, last started first, and remove PostgreSQL if it was started."""
        self.postgres.remove(grace)
        for component in reversed(self.components.values()):
            component.stop(grace)

    def close(self) -> None:
        """`stop()` with the default grace period (what `with` calls)."""
        self.stop()

    def _get(self, kind: type[C]) -> C:
        component = self.components.get(kind.name)
        if not isinstance(component, kind):
            raise StackError(
                f"this dev stack has no {kind.name} (components: {list(self.components)})"
            )
        return component
