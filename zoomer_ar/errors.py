"""Errors that the CLI turns into one-line messages and exit codes."""

from __future__ import annotations


class ZoomerError(Exception):
    """Base class for errors with a user-facing one-line message."""

    exit_code = 1


class InputError(ZoomerError):
    """The input cannot be used (not a trace, truncated, too big...). Exit code 2."""

    exit_code = 2

    def __init__(self, path: str | None, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)

    def __reduce__(self):
        # rebuilt from (path, reason): a rank read in a worker process hands its refusal back
        # through pickle (Exception's default would call __init__ with the message alone)
        return (type(self), (self.path, self.reason))


class OutputError(ZoomerError):
    """An output cannot be written (full disk, no permission, a folder in the way). Exit code 2."""

    exit_code = 2

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"cannot write {path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class RuleError(ZoomerError):
    """A rule file under rules/ is invalid."""

    exit_code = 1
