"""librdkafka's mock Kafka cluster in a long-lived process: `python -m kspout.devstack.mock_kafka`.

The mock cluster lives inside a librdkafka client, so this process keeps one producer open,
writes the brokers' `host:port` list (librdkafka picks the port) as JSON to `--address-file` and
stdout, then waits for SIGTERM or SIGINT. The data lives in memory: a restart starts empty, on a
new port. Topics auto-create (4 partitions); the mock keeps roughly the last 5 MB per partition.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import Producer

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def start_cluster(num_brokers: int = 1) -> tuple[Producer, str]:
    """A producer hosting a mock cluster, and the cluster's bootstrap address."""
    producer = Producer({"test.mock.num.brokers": num_brokers, "log_level": 0})
    brokers = producer.list_topics(timeout=10).brokers
    address = ",".join(f"{b.host}:{b.port}" for b in sorted(brokers.values(), key=lambda b: b.id))
    return producer, address


def write_address(path: Path, brokers: str) -> None:
    """Write `{"brokers": ...}` atomically, so a reader never sees a half-written file."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"brokers": brokers}))
    os.replace(partial, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the mock cluster until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address-file", type=Path, required=True)
    parser.add_argument("--brokers", type=int, default=1, help="number of mock brokers")
    args = parser.parse_args(argv)
    # Block the stop signals before librdkafka starts its threads (they inherit the mask), so
    # only `sigwait` below receives them.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    producer, brokers = start_cluster(args.brokers)
    write_address(args.address_file, brokers)
    print(json.dumps({"brokers": brokers}), flush=True)
    signal.sigwait(STOP_SIGNALS)
    del producer  # destroys the mock cluster
    return 0


if __name__ == "__main__":
    sys.exit(main())
