"""kspout.worker_clients: one client per equal settings, whatever setting differs."""

from __future__ import annotations

import threading

from pydantic import SecretStr

from kspout.config import TopicConfig
from kspout.worker_clients import WorkerClients


class Client:
    def __init__(self, *args: object) -> None:
        self.args = args
        self.closed = False


def test_equal_settings_share_one_client_and_any_other_setting_gets_its_own() -> None:
    clients = WorkerClients(Client)
    config = TopicConfig(topic="t", spout_id="s", kafka={"a": 1, "b": 2})
    same = TopicConfig(topic="t", spout_id="s", kafka={"b": 2, "a": 1})
    assert clients.get(config) is clients.get(same), "equal settings, in any order, share"
    other_timeout = config.model_copy(update={"fetch_timeout": config.fetch_timeout + 1})
    assert clients.get(other_timeout) is not clients.get(config)
    assert clients.get(config, "ns1") is not clients.get(config, "ns2")


def test_a_secret_is_part_of_the_key() -> None:
    clients = WorkerClients(Client)
    one = TopicConfig(topic="t", spout_id="s", kafka={"sasl.password": SecretStr("one")})
    two = TopicConfig(topic="t", spout_id="s", kafka={"sasl.password": SecretStr("two")})
    assert clients.get(one) is not clients.get(two)


def test_a_refused_client_is_replaced_and_pop_forgets_one() -> None:
    clients = WorkerClients(Client, usable=lambda client: not client.closed)
    first = clients.get("x")
    first.closed = True
    second = clients.get("x")
    assert second is not first
    assert clients.pop("x") is second
    assert clients.pop("x") is None
    assert clients.get("x") is not second


def test_per_thread_clients_are_not_shared_between_threads() -> None:
    clients = WorkerClients(Client, per_thread=True)
    mine = clients.get("x")
    theirs: list[Client] = []
    thread = threading.Thread(target=lambda: theirs.append(clients.get("x")))
    thread.start()
    thread.join()
    assert clients.get("x") is mine
    assert theirs[0] is not mine


def test_close_all_closes_every_client_and_forgets_it() -> None:
    clients = WorkerClients(Client)
    made = [clients.get("a"), clients.get("b")]
    closed: list[Client] = []
    clients.close_all(closed.append)
    assert sorted(closed, key=id) == sorted(made, key=id)
    assert clients.get("a") not in made
