"""The executor side: what runs a partition task, in-process or in a Spark Python worker.

* `task` — a plain handler's task body: fetch, one handler loop, compact outcomes.
* `gates` — the loop's pluggable gate: which records run now (`ordering = key`).
* `outcome_log` — one task's outcomes, acks folded into counted runs.
* `slices` — a key-ordered partition split into slices by key hash, their results joined.
* `topology` — a bolt chain split into stages, and a stage's run inside one task.
* `fetchers` — this process's cached fetchers, one per topic config.
* `local` — the in-process executor of `kspout run`.

It implements `kspout.contract` and reports over `kspout.channel`; the driver imports neither
this package nor the Spark backend built on it.
"""
