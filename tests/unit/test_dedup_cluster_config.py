"""`[redis] cluster`: how a topic file points the dedup bolt at a Redis Cluster, and what it
refuses (no server: the checks are the config's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kspout.config import load_config
from kspout.errors import ConfigError

TOPIC = """
topic = "orders"
spout_id = "orders-spout"
topology_name = "orders"
zk_root = "/kspout"
brokers = "127.0.0.1:9092"
zookeeper = "127.0.0.1:2181"

[redis]
"""


def topic_file(tmp_path: Path, redis: str) -> Path:
    path = tmp_path / "orders.toml"
    path.write_text(TOPIC + redis, encoding="utf-8")
    return path


def test_a_cluster_is_one_node_url_and_cluster_true(tmp_path: Path) -> None:
    config = load_config(topic_file(tmp_path, 'url = "redis://10.0.0.1:7000/0"\ncluster = true\n'))

    assert config.redis.cluster is True
    assert config.redis_args()["url"] == "redis://10.0.0.1:7000/0"
    assert load_config(topic_file(tmp_path, "")).redis.cluster is False


@pytest.mark.parametrize(
    "url", ["unix:///run/redis.sock", "redis://10.0.0.1:7000/2", "rediss://10.0.0.1:7000/1"]
)
def test_a_cluster_url_that_cannot_name_one_is_refused_naming_the_file_and_key(
    tmp_path: Path, url: str
) -> None:
    path = topic_file(tmp_path, f'url = "{url}"\ncluster = true\n')

    with pytest.raises(ConfigError) as raised:
        load_config(path)

    assert raised.value.key == "redis.cluster"
    message = str(raised.value)
    assert str(path) in message and "true or false" in message and "database 0" in message
    assert url not in message  # urls may hold secrets: never echoed
