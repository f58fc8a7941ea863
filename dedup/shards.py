"""Which hash tag each Kafka partition's records use on a Redis Cluster: chosen by slot, so the
partitions of any namespace spread evenly over the masters, and fixed once chosen.

A cluster puts a key on the master owning its slot, CRC16 of its hash tag mod 16384. Tags named
only by the partition (`<namespace>:p<partition>`) land wherever their hash falls: 12
partitions of one namespace made 6/3/3 shards on three masters. Here partition p is meant for
master (p + s) mod M of the M masters in slot order (s: the slot of the namespace's name, so
namespaces start on different masters), and its tag is the first of `<namespace>:p<p>`,
`<namespace>:p<p>:1`, `:2`, ... whose slot that master owns (about M tries). P partitions then
put ⌈P/M⌉ or ⌊P/M⌋ shards on each master, whatever the namespace.

A tag must not change while its records live: a partition's records, fence and effect keys are
under it, and two tags for one partition would be two dedup windows and two token counters (a
message could run twice). The slot map does change (a resharding, a master added), so a tag is
chosen once, by the first store to use the partition, and kept in the namespace's shard map,
the hash `{<namespace>}:shards` (partition -> tag, written by the `SHARD_TAGS` script with
HSETNX: stores choosing at once agree on the first tag written). A store reads the map before
it uses a partition (once per partition and process: while the map's master is down, a process
that has not read a partition's tag yet cannot use that partition); the cluster as it is then
decides only for partitions the map lacks. A resharding moves slots with their keys, so a
partition's shard stays whole wherever its slot goes (how even the spread stays is then up to
where the operator moves slots). The map never expires (a few bytes per partition). If Redis
loses it (its master lost data), the next store chooses again: on an unchanged cluster the
same tags; on a changed one possibly others, whose partitions then start a new dedup window
(like any loss of records; `dedup.server_checks` names the settings that make losses likely).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, count

from redis.cluster import RedisCluster
from redis.crc import key_slot

from dedup.scripts import SHARD_TAGS
from dedup.wire import Call, ScriptRunner


def shard_map_key(namespace: str) -> str:
    """The hash that keeps the namespace's partition -> tag map (in the namespace's slot)."""
    return f"{{{namespace}}}:shards"


def slot_of(tag: str) -> int:
    """The cluster slot of every key carrying hash tag `tag`."""
    return int(key_slot(tag.encode()))


def masters_in_slot_order(owners: Mapping[int, str]) -> list[str]:
    """The masters of a slot -> master map, in the order of the lowest slot each owns."""
    first: dict[str, int] = {}
    for slot, master in sorted(owners.items()):
        first.setdefault(master, slot)
    return list(first)


def choose_tag(
    namespace: str, partition: int, owner: Callable[[int], str | None], masters: Sequence[str]
) -> str:
    """The tag for `partition` on a cluster whose slot owners are `owner(slot)`: the first of
    `<namespace>:p<partition>[:k]` whose slot its master (round robin, see above) owns."""
    target = masters[(partition + slot_of(namespace)) % len(masters)]
    base = f"{namespace}:p{partition}"
    for k in count():
        tag = f"{base}:{k}" if k else base
        if owner(slot_of(tag)) == target:
            return tag
    raise AssertionError("unreachable: count() never ends")


class ShardTags:
    """The tags of one namespace's partitions on a Redis Cluster: read from its shard map, or
    chosen by slot into it, once per partition and process (then cached). Safe to share
    between threads (a race chooses twice; the map keeps one)."""

    def __init__(self, client: RedisCluster, runner: ScriptRunner, namespace: str) -> None:
        self._client = client
        self._runner = runner
        self._namespace = namespace
        self._tags: dict[int, str] = {}

    def __getitem__(self, partition: int) -> str:
        if partition not in self._tags:
            self.load((partition,))
        return self._tags[partition]

    def load(self, partitions: Iterable[int]) -> None:
        """Know the tags of `partitions`: one round trip for those not known yet."""
        missing = sorted({p for p in partitions if p not in self._tags})
        if not missing:
            return
        owners = {
            slot: nodes[0].name
            for slot, nodes in self._client.nodes_manager.slots_cache.items()
            if nodes
        }
        masters = masters_in_slot_order(owners)
        proposed = [choose_tag(self._namespace, p, owners.get, masters) for p in missing]
        call = Call(
            SHARD_TAGS,
            [shard_map_key(self._namespace)],
            list(chain.from_iterable(zip(missing, proposed, strict=True))),
        )
        [(tags, _)] = self._runner.run([call])
        for partition, tag in zip(missing, tags, strict=True):
            self._tags[partition] = tag.decode() if isinstance(tag, bytes) else tag
