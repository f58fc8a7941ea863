"""Two chained topologies, exactly once end to end: trades -> notifications -> users.

Stage one reads trades and publishes a notification for the buyer and one for the seller to the
notifications topic, through `kspout.output.Publish` and `KafkaOutput`: at least once, so a
retry or a timeout replay publishes a trade's notifications again, but always under the same
`kspout.id` header (derived from the trade's partition and offset and the notification's index).
Stage two "pushes" each notification to its user behind the dedup bolt keyed on that header
(`[dedup] id_source = "header:kspout.id"`), so every notification reaches its user once.

The trades carry the demo's faults (kspout_demo/jobs.py): trades that fail once after publishing,
fail once after their first notification, sleep past `message_timeout`, or always fail.

    python -m examples.chained                # on the embedded stack and Spark local[2]

`stages.py` holds both stages; `trades.toml` and `notifications.toml` are their topic files.
"""
