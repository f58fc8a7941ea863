"""Sharing a spout's partitions among its live instances: the ownership nodes (`tree`), the
balanced and sticky assignment (`assignment`) and this instance's part (`membership`)."""
