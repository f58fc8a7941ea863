"""A dev stack's addresses, and `<dir>/stack.json`, through which later commands find it.

`kspout dev up` writes the file and leaves the servers running; `kspout dev status|down`,
every command's `--dev` and tests read it back with `read_state`, `load_stack_info` or
`find_stack`, which looks in the working directory and then its parents, as git finds its
repository.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kspout.config import ENV_OVERRIDES, ENV_REDIS_URL
from kspout.devstack.ports import LOOPBACK, port_open
from kspout.devstack.processes import pid_alive
from kspout.errors import StackError

COMPONENTS = ("kafka", "zookeeper", "redis")  # also the start order; stopped in reverse
STATE_FILE = "stack.json"
ENV_DEV_DIR = "KSPOUT_DEV_DIR"
DIR_NAME = ".kspout-dev"


@dataclass(frozen=True)
class StackInfo:
    """Where clients connect; a component that is not part of the stack has an empty address."""

    brokers: str
    zookeeper: str
    redis_url: str

    def env(self) -> dict[str, str]:
        """The environment overrides kspout's config reads (`KSPOUT_BROKERS`, ...)."""
        values = {env: getattr(self, key) for env, key in ENV_OVERRIDES.items()}
        values[ENV_REDIS_URL] = self.redis_url
        return {env: value for env, value in values.items() if value}


@dataclass(frozen=True)
class ComponentState:
    """One running server: `started` is its start time, to tell a reused pid from it."""

    pid: int
    started: int | None
    address: str
    port: int
    log: str
    start_seconds: float | None = None  # how long its last start took (None: not known)

    def up(self) -> bool:
        """True if the process still runs and its port answers."""
        return pid_alive(self.pid, self.started) and port_open(LOOPBACK, self.port)


@dataclass(frozen=True)
class StackState:
    """The content of `stack.json`."""

    info: StackInfo
    components: dict[str, ComponentState]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackState:
        return cls(
            info=StackInfo(**data["info"]),
            components={
                name: ComponentState(**fields) for name, fields in data["components"].items()
            },
        )


def default_dir() -> Path:
    """`$KSPOUT_DEV_DIR`, else `.kspout-dev` in the current directory."""
    return Path(os.environ.get(ENV_DEV_DIR) or DIR_NAME)


def read_state(workdir: Path) -> StackState | None:
    """The state `kspout dev up` left in `workdir`, or None if there is none."""
    try:
        data = json.loads((workdir / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    return StackState.from_json(data)


def write_state(workdir: Path, state: StackState) -> None:
    """Write `stack.json` atomically (a reader sees the old file or the new one)."""
    workdir.mkdir(parents=True, exist_ok=True)
    partial = workdir / f"{STATE_FILE}.partial"
    partial.write_text(json.dumps(state.to_json(), indent=2))
    os.replace(partial, workdir / STATE_FILE)


def clear(workdir: Path, *, keep_data: bool = False) -> None:
    """Remove `stack.json` and, unless `keep_data`, the servers' data and logs.

    Data goes by default, all of it together: the next stack starts with no topics and no
    stored offsets, so no commit point in ZooKeeper points into topics of an older stack.
    """
    (workdir / STATE_FILE).unlink(missing_ok=True)
    if keep_data:
        return
    for name in COMPONENTS:
        shutil.rmtree(workdir / name, ignore_errors=True)
    if workdir.is_dir() and not any(workdir.iterdir()):
        workdir.rmdir()


def load_stack_info(workdir: Path | None = None) -> StackInfo | None:
    """The addresses of the dev stack running from `workdir` (default: `default_dir()`), or
    None if none runs there or any of its servers is down."""
    state = read_state(workdir if workdir is not None else default_dir())
    if state is None or not all(c.up() for c in state.components.values()):
        return None
    return state.info


def search_dirs() -> list[Path]:
    """Where `find_stack` looks, nearest first: `$KSPOUT_DEV_DIR` alone when it is set, else
    `.kspout-dev` in the working directory and in each of its parents."""
    if os.environ.get(ENV_DEV_DIR):
        return [default_dir().absolute()]
    here = Path.cwd()
    return [folder / DIR_NAME for folder in (here, *here.parents)]


def find_dir() -> Path | None:
    """The nearest of `search_dirs()` that holds a `stack.json` (running or not)."""
    return next((d for d in search_dirs() if (d / STATE_FILE).is_file()), None)


def find_stack() -> tuple[Path, StackInfo]:
    """The nearest dev stack (its folder and addresses), if every server of it is up.

    Raises StackError naming where it looked when there is none, or which servers are down in
    the one it found; both say where to run `kspout dev up`.
    """
    found = find_dir()
    state = None if found is None else read_state(found)
    if found is None or state is None:
        raise StackError(not_found(search_dirs()))
    down = [name for name, component in state.components.items() if not component.up()]
    if down:
        raise StackError(
            f"the dev stack in {found} is not running ({', '.join(down)} down): start it "
            f"again with `cd {found.parent} && kspout dev up`"
        )
    return found, state.info


def not_found(looked_in: list[Path]) -> str:
    """What to say when `search_dirs` found no stack: where it looked, and what to do."""
    if os.environ.get(ENV_DEV_DIR):
        return (
            f"no dev stack in {looked_in[0]} (${ENV_DEV_DIR}): start one there with "
            f"`kspout dev up`, or unset {ENV_DEV_DIR} to look in the working directory and its "
            "parents"
        )
    return (
        f"no dev stack found: looked for {DIR_NAME}/{STATE_FILE} in {looked_in[0].parent} and "
        "its parents. If one runs elsewhere, `cd` into the directory where it was started (or "
        "one below it); else start one with `kspout dev up` in your project directory"
    )
