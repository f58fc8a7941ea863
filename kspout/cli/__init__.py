"""The `kspout` command: `run`, `produce`, `status`, `lag`, `rebalance`, `pause`, `resume`,
`offsets show|set|reset`, `dlq show|replay`, `dev up|down|status`; and `demo`, which
`kspout_demo` adds through the `kspout.commands` entry points (`kspout.cli.extensions`).

`main` is the group (`group`); each sub-command lives in its own module and registers itself
on it when imported here.
"""

from kspout.cli import dev as _dev  # noqa: F401
from kspout.cli import dlq as _dlq  # noqa: F401
from kspout.cli import offsets as _offsets  # noqa: F401
from kspout.cli import ownership as _ownership  # noqa: F401
from kspout.cli import produce as _produce  # noqa: F401
from kspout.cli import run as _run  # noqa: F401
from kspout.cli import status as _status  # noqa: F401
from kspout.cli.group import main

__all__ = ["main"]
