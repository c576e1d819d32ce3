"""Progress bars in the terminal for the commands that read traces (rich, imported when a bar is shown)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROGRESS_MIN_BYTES = 32 << 20


class Bars:
    """A bar for each read of a file of PROGRESS_MIN_BYTES or more, shown from its first report:
    reports that start again from 0, or a new callback for the same file, are another read of it (the
    streaming reader's second pass, its evidence frames' pass, surgery's plan and copy passes), shown
    as "(pass N)". close() takes down the bars of reads that stopped
    short (a refused file, a probe of a file's first events)."""

    def __init__(self) -> None:
        self._open: dict[int, Any] = {}  # id -> rich display of a read in progress
        self._reads: dict[Path, int] = {}  # reads of each file so far (a command may read a file twice)

    def __call__(self, path: Path):
        try:
            size = path.stat().st_size
        except OSError:
            return None
        if size < PROGRESS_MIN_BYTES:
            return None
        state: dict[str, Any] = {"bar": None, "last": 0}

        def open_bar(total: int) -> None:
            import sys

            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            n = self._reads[path] = self._reads.get(path, 0) + 1
            console = Console(file=sys.stderr)  # stderr's terminal turned the bars on; stdout may be a file
            display = Progress(  # drawn in a terminal only (--progress on a file or pipe: not a blank line a bar)
                TextColumn("[bold]reading[/] {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), transient=True, console=console, disable=not console.is_terminal,
            )
            display.start()
            self._open[id(display)] = display
            label = path.name if n == 1 else f"{path.name} (pass {n})"
            state["bar"], state["last"] = (display, display.add_task(label, total=total)), 0

        def close_bar() -> None:
            display = state["bar"][0]
            display.stop()
            self._open.pop(id(display), None)
            state["bar"] = None

        def update(done: int, total: int) -> None:
            if state["bar"] is not None and done < state["last"]:  # a new read of the file
                close_bar()
            if state["bar"] is None:
                open_bar(total)
            display, task = state["bar"]
            display.update(task, completed=done, total=total)
            state["last"] = done
            if done >= total:
                close_bar()

        return update

    def close(self) -> None:
        for display in list(self._open.values()):
            display.stop()
        self._open.clear()


def bar_factory(enabled: bool) -> Bars | None:
    """Bars when enabled (a terminal, or --progress), else None: no callbacks at all."""
    return Bars() if enabled else None
