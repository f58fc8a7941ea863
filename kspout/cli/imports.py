"""Why importing the module `kspout run --handler module:attr` names failed, in one line.

A user's module can fail to import in many ways (a typo in its name, a SyntaxError, an
exception its top level raises, a dependency that is not installed); each gets one line naming
the file and line, and what to do, instead of a traceback.
"""

from __future__ import annotations

import importlib
import os
import traceback


def import_failure(module_name: str, exc: Exception) -> str:
    """Why importing the handler's module failed, in one line: a module that is not there, or
    the exception its code raised and where (the file and line of that code, not importlib's)."""
    if (
        isinstance(exc, ModuleNotFoundError)
        and exc.name
        and f"{module_name}.".startswith(f"{exc.name}.")
    ):
        return (
            f"no module {module_name!r} in {os.getcwd()} or on the Python path: check the name, "
            "or run kspout from the directory that holds it"
        )
    if isinstance(exc, SyntaxError):
        what, where = f"SyntaxError: {exc.msg}", f"{exc.filename}, line {exc.lineno}"
    else:
        machinery = (os.path.dirname(importlib.__file__), "<")
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in frames if not f.filename.startswith(machinery)]
        what = f"{type(exc).__name__}: {exc}"
        where = f"{ours[-1].filename}, line {ours[-1].lineno}" if ours else "at import"
    return (
        f"importing {module_name!r} failed: {what} ({where}); fix it, or see the whole "
        f"traceback with `python -c 'import {module_name}'`"
    )
