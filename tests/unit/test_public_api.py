"""The names the issue promises at the package root."""

import kspout
from tests.unit import pm_helpers


def test_partition_manager_is_usable_from_the_package_root() -> None:
    pm = kspout.PartitionManager(kspout.PartitionPolicy(max_retries=0), 7, clock=lambda: 0.0)
    assert list(pm.plan(high_watermark=9, max_new=10)) == [7, 8]
    pm.fail(7, kspout.FailReason.EXCEPTION, "boom")
    pm_helpers.ack(pm, 8)
    stats = pm.stats()
    assert (stats.acked, stats.dead_letter_pending, pm.commit_point) == (1, 1, 7)
    assert {kspout.FailReason.EXCEPTION, kspout.FailReason.TIMEOUT} <= set(kspout.FailReason)
