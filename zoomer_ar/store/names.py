"""One spelling per stored name: job, team, owner and GPU type names are kept and looked up in Unicode NFC.

`café` typed on one keyboard is `cafe` + U+0301 (a combining accent: NFD, as macOS file names are) and `café`
(U+00E9) on another; compared as they are, they were two teams, and recording a job under the other spelling
was refused as a team change between two names that print the same. Every entry point of the store (record,
analyze --record, batch, digest --team, history JOB, the service) passes through here, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import unicodedata


def canonical(name: str | None) -> str | None:
    """`name` in NFC (None stays None)."""
    return None if name is None else unicodedata.normalize("NFC", name)
