"""A nemesis: one long run of the demo's exactly-once job while faults strike at random.

Several `kspout run` instances (the in-process executor: Spark is too heavy for the 2-core
machines this runs on in CI) share one spout id and run `CountOnce` behind the dedup bolt
(`job.py`) over a replicated topic on a three-node Kafka cluster, with ZooKeeper and Redis
(append-only file) beside it (`stack.py`). A feed produces the demo's sentences, a few of them
poison or without a key, evenly over the run (`ledger.py`). Meanwhile a schedule drawn from the
seed strikes: instance kills, a hung handler, broker and leader kills, ZooKeeper and Redis
restarts, an instance stopped past its session (`faults.py`), each checked as struck, while a
monitor samples the commit points (`monitor.py`). Once every commit point reached its high
watermark the instances are stopped and the run is judged against the ledger and the sinks
(`verdict.py`): every healthy message applied exactly once, every poison or unkeyed one
dead-lettered and no healthy one, the commit points at the high watermarks; and a table says
when each fault struck and what it cost.
"""
