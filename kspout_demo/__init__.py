"""The demo, beside the library: a Storm-style word count on Spark over a sentence stream with
injected failures, at least once and exactly once (the dedup bolt), with a verdict.

It uses both `kspout` and `dedup`, which never import it: `kspout demo` reaches it through
the `kspout.commands` entry points (`kspout.cli.extensions`). `jobs` holds the stream, bolts and
handler; `command` the command's options; `run` the run and its report.
"""
