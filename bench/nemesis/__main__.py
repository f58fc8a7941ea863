"""`python -m bench.nemesis`: one nemesis run, its table of faults and its checks.

    python -m bench.nemesis                                   # CI size: about 2 minutes on 2 cores
    python -m bench.nemesis --messages 1000000 --minutes 30   # on demand

Progress goes to stderr; the table, the evidence of each strike, the figures and the checks
to stdout (with `--json`: to stderr, and the report as one JSON object to stdout). Exits 0 when
every check passed and no instance died that no fault killed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TextIO

from bench.nemesis.runner import Options, Report, run


def print_report(report: Report, out: TextIO) -> None:
    print(report.verdict.table(), file=out)
    print(file=out)
    for strike in report.strikes:
        print(f"{strike.kind} ({strike.target}): {strike.evidence}", file=out)
    figures = report.verdict.figures
    print(
        f"\n{figures['messages']} messages ({figures['healthy']} healthy, {figures['own_fault']} "
        f"poison or unkeyed); redelivered {figures['redelivered']}; healthy handler runs "
        f"{figures['handler_runs']}, replays {figures['replays']}, effects applied "
        f"{figures['effects']}; dead letters "
        f"{figures['dead_letters']} ({figures['dead_lettered_twice']} written twice); commits "
        f"refused (zombies) {figures['commits_refused']}",
        file=out,
    )
    print(f"seconds: {report.seconds}", file=out)
    for crash in report.crashes:
        print(f"CRASH {crash}", file=out)
    for name, ok in report.verdict.checks.items():
        print(f"{'OK  ' if ok else 'FAIL'} {name}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=5_000)
    parser.add_argument("--minutes", type=float, default=1.5, help="how long the feed lasts")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    parser.add_argument("--keep", help="keep the servers' data and the logs in this folder")
    args = parser.parse_args(argv)
    # Clients' retries while the nemesis holds a server down are its own doing: errors only.
    logging.basicConfig(level=logging.ERROR)
    options = Options(
        args.messages, args.minutes, args.instances, args.seed, args.brokers, keep=args.keep
    )
    report = run(options)
    print_report(report, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(report.json(), indent=2))
    return 0 if report.verdict.ok and not report.crashes else 1


if __name__ == "__main__":
    sys.exit(main())
