"""A KRaft node that also serves a secured listener: SASL_SSL with SCRAM-SHA-512 logins over TLS,
and Kafka's own authorizer (`StandardAuthorizer`), so a client sees what it would on a locked-down
production cluster: a refused login, a refused topic, a refused write.

The PLAINTEXT listener stays, for the controller link and the test's own setup (topics, ACLs):
its clients are `User:ANONYMOUS`, a super user. Every SCRAM user on the SASL_SSL listener gets
only what an ACL grants (`allow.everyone.if.no.acl.found` is false). SCRAM users
are written into the metadata log when the data folder is formatted, so they exist from the
first start.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from kspout.devstack.kafka_broker import KafkaBroker
from kspout.devstack.ports import LOOPBACK, free_port
from kspout.errors import StackError
from kspout.kafka import LIBRDKAFKA_LOG

Acl = TypeVar("Acl", AclBinding, AclBindingFilter)

MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 4096  # the storage tool's default, and Kafka's minimum
LISTENER = "SASL_SSL"
SUPER_USERS = "User:ANONYMOUS"  # the PLAINTEXT listener's clients (the controller's too)


class SecuredKafkaBroker(KafkaBroker):
    """A `KafkaBroker` with a SASL_SSL listener (`secure_address`) and ACLs enforced.

    `certificate` is a PEM file holding the broker's private key (PKCS#8, unencrypted) and its
    certificate chain, issued for 127.0.0.1; `users` maps each SCRAM user to its password.
    """

    def __init__(
        self, workdir: Path, *, certificate: Path, users: Mapping[str, str], **kwargs: Any
    ) -> None:
        super().__init__(workdir, **kwargs)
        self.certificate = certificate
        self.users = dict(users)
        self._secure_port: int | None = None

    @property
    def secure_address(self) -> str:
        """`host:port` of the SASL_SSL listener."""
        if self._secure_port is None:
            raise StackError(f"{self.name} node {self.node_id} has not been started")
        return f"{LOOPBACK}:{self._secure_port}"

    def reserve_ports(self) -> None:
        super().reserve_ports()
        if self._secure_port is None:
            self._secure_port = free_port()

    def server_properties(self) -> dict[str, str]:
        """The plain node's properties, with the SASL_SSL listener and the authorizer added."""
        properties = super().server_properties()
        secured = f"{LISTENER}://{self.secure_address}"
        prefix = f"listener.name.{LISTENER.lower()}"
        return {
            **properties,
            "listeners": f"{properties['listeners']},{secured}",
            "advertised.listeners": f"{properties['advertised.listeners']},{secured}",
            "listener.security.protocol.map": (
                f"{properties['listener.security.protocol.map']},{LISTENER}:{LISTENER}"
            ),
            "sasl.enabled.mechanisms": MECHANISM,
            f"{prefix}.{MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            f"{prefix}.ssl.keystore.type": "PEM",
            f"{prefix}.ssl.keystore.location": str(self.certificate),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": SUPER_USERS,
            "allow.everyone.if.no.acl.found": "false",
        }

    def _format_options(self) -> list[str]:
        """Each SCRAM user's credential, written into the metadata log by the storage tool."""
        options: list[str] = []
        for name, password in self.users.items():
            options += ["--add-scram", f"{MECHANISM}=[name={name},password={password}]"]
        return options


def grant(
    brokers: str,
    principal: str,
    name: str,
    *operations: str,
    kind: str = "TOPIC",
    timeout: float = 30,
) -> None:
    """Allow `principal` (`User:<name>`) each operation (`READ`, `WRITE`, `DESCRIBE`, ...) on
    the resource `name` of `kind` (`TOPIC`, `GROUP`), from any host, through the admin API on
    `brokers` (a super user's listener: the secured node's PLAINTEXT one)."""
    admin = _admin(brokers)  # held until the answers are in: a dropped client cancels them
    bindings = _acls(AclBinding, principal, name, operations, kind)
    for done in admin.create_acls(bindings, request_timeout=timeout).values():
        done.result(timeout)


def revoke(
    brokers: str,
    principal: str,
    name: str,
    *operations: str,
    kind: str = "TOPIC",
    timeout: float = 30,
) -> None:
    """Remove what `grant` allowed with the same arguments (a right taken away mid-run)."""
    admin = _admin(brokers)
    filters = _acls(AclBindingFilter, principal, name, operations, kind)
    for done in admin.delete_acls(filters, request_timeout=timeout).values():
        done.result(timeout)


def set_password(brokers: str, user: str, password: str, *, timeout: float = 30) -> None:
    """Give the SCRAM user `user` a new password, through the admin API on `brokers` (as
    `grant`): a credential rotated while that user's clients run. Their sessions go on until
    they log in again (a reconnect, or the listener's `connections.max.reauth.ms`)."""
    admin = _admin(brokers)
    info = ScramCredentialInfo(ScramMechanism[MECHANISM.replace("-", "_")], SCRAM_ITERATIONS)
    change = UserScramCredentialUpsertion(user, info, password.encode())
    for done in admin.alter_user_scram_credentials([change], request_timeout=timeout).values():
        done.result(timeout)


def _admin(brokers: str) -> AdminClient:
    client: dict[str, Any] = {"bootstrap.servers": brokers, "logger": LIBRDKAFKA_LOG}
    return AdminClient(client)


def _acls(
    cls: type[Acl], principal: str, name: str, operations: tuple[str, ...], kind: str
) -> list[Acl]:
    """One allow entry (or filter) per operation on the literal resource, from any host."""
    return [
        cls(
            ResourceType[kind],
            name,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation[operation],
            AclPermissionType.ALLOW,
        )
        for operation in operations
    ]
