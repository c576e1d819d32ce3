"""Progress bars in the terminal for the commands that read traces (rich, imported when a bar is shown)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROGRESS_MIN_BYTES = 32 << 20


def bar_factory(enabled: bool):
    """A bar for each read of a file of 32 MB or more: reports that start again from 0 are another
    read of the file (the streaming reader's second pass, its evidence frames' pass), shown as
    "(pass N)" rather than left without a bar."""
    if not enabled:
        return None
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    def factory(path: Path):
        try:
            size = path.stat().st_size
        except OSError:
            return None
        if size < PROGRESS_MIN_BYTES:
            return None
        state: dict[str, Any] = {"bar": None, "last": 0, "reads": 0}

        def open_bar(total: int) -> None:
            state["reads"] += 1
            progress = Progress(
                TextColumn("[bold]reading[/] {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), transient=True,
            )
            progress.start()
            label = path.name if state["reads"] == 1 else f"{path.name} (pass {state['reads']})"
            state["bar"], state["last"] = (progress, progress.add_task(label, total=total)), 0

        def update(done: int, total: int) -> None:
            if state["bar"] is None or done < state["last"]:  # a new read of the file
                if state["bar"] is not None:
                    state["bar"][0].stop()
                open_bar(total)
            progress, task = state["bar"]
            progress.update(task, completed=done, total=total)
            state["last"] = done
            if done >= total:
                progress.stop()
                state["bar"] = None

        open_bar(size)
        return update

    return factory
