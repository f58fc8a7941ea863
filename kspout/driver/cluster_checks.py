"""The checks a run makes of its Kafka cluster before it claims anything: the topic exists,
the principal has its rights, the dead-letter topic is there.

A cluster that answers but cannot serve yet (a controller election, a leader moving, a broker
hung past the request timeout) is waited out, as a running spout waits out the same faults
behind its partitions' breakers, for as long as they last: a run started during a broker's
restart starts once the cluster serves, instead of exiting. A cluster that does not answer at
all is refused earlier, when the run connects (`KafkaUnreachable`: most often a wrong address).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

from kspout.config import TopicConfig
from kspout.errors import KafkaRequestFailed
from kspout.kafka import KafkaMetadata
from kspout.kafka.deadletter import require_dead_letter_topic
from kspout.kafka.rights import require_spout_rights
from kspout.policy import Backoff

log = logging.getLogger(__name__)


def check_cluster(
    config: TopicConfig,
    metadata: KafkaMetadata,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Run the checks; while one fails transiently, log why and ask again after
    `[infra_backoff]`'s waits. Any other failure (a missing topic, a right refused) is raised."""
    waits = config.infra_backoff
    backoff = Backoff(waits.initial, waits.multiplier, waits.max)
    for retry in itertools.count(1):
        try:
            metadata.require_topic(config.topic)
            require_spout_rights(config)
            require_dead_letter_topic(config)  # after the rights: Describe on it is known
            return
        except KafkaRequestFailed as exc:
            if not exc.transient:
                raise
            wait = backoff.delay(retry)
            log.warning("the Kafka cluster cannot serve yet (%s); asking again in %.3gs", exc, wait)
            sleep(wait)
