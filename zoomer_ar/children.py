"""Python child processes that import nothing from the current directory.

A spawned child (multiprocessing's spawn, Dask's workers, `python -m`) starts as `python -c ...` or
`python -m ...`, which puts the current directory first on sys.path before anything is imported: run
from a user's folder that holds a `multiprocessing/` package or a `random.py` (a PyTorch checkout, a
training repo), the child imported and ran the user's module in place of the standard library's -
user code executed, and the pool broke (`analyze` exited 1, "BrokenProcessPool"). Python 3.11's
PYTHONSAFEPATH leaves the current directory out; the children's own sys.path is the parent's (the
installed package's), so nothing else changes. It is set only while the engine starts its own
children: a user's program (`zoomer-ar relaunch`) keeps its usual sys.path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

SAFE_PATH = "PYTHONSAFEPATH"


@contextmanager
def no_cwd_imports() -> Iterator[None]:
    """While the block runs, Python children started from this process do not import from the
    current directory (PYTHONSAFEPATH=1 in the environment they inherit)."""
    before = os.environ.get(SAFE_PATH)
    os.environ[SAFE_PATH] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SAFE_PATH, None)
        else:
            os.environ[SAFE_PATH] = before


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an engine's own Python child process (subprocess.Popen(env=...))."""
    return {**(os.environ if env is None else env), SAFE_PATH: "1"}
