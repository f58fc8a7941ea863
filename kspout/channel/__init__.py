"""The outcome channel: running tasks tell the driver where they are while they run.

Spark returns a task's results only when its whole job ends, so on its own the driver cannot
tell a slow record from the thousands queued behind it, nor which record a crashed or hung
task was on. Each task therefore keeps a small reporter thread that sends `Beat`s (the root
being handled and for how long, and for plain handlers the offsets settled so far) to a
listener in the driver, and its final results as soon as they exist. What travels (`Beat`,
`Final`) and where to (`ChannelAddress`) are part of the driver-executor contract,
`kspout.contract`.

* `beacon` — the one attribute executor code sets per record (`thread_beacon().current`).
* `reporter` — executor side: a thread per task that sends beats.
* `listener` — driver side: accepts connections and queues what arrives.

The in-process executor's tasks use the same channel from their worker thread, so the driver
watches a long in-process batch as it watches a Spark job.

The channel is an accelerator, never the only path: results still come back through Spark, so
a channel that cannot connect costs precision (timeouts fall back to whole batches), not data.
"""
