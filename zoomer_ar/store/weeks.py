"""ISO weeks as `YYYY-Www` labels (they sort as text), and the times they come from."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

from ..errors import ZoomerError

_WEEK_RE = re.compile(r"^(\d{4})-?W(\d{1,2})$", re.I)


class WeekError(ZoomerError):
    exit_code = 2


#: the first year a week or time may be in: no profiled run is older, and the digest's twelve-week chart of a
#: week in year 1 would reach before the first date there is (OverflowError)
FIRST_YEAR = 1970


def week_of(when: datetime | date) -> str:
    d = when.astimezone(UTC).date() if isinstance(when, datetime) and when.tzinfo else (
        when.date() if isinstance(when, datetime) else when
    )
    y, w, _ = d.isocalendar()
    return f"{y:04d}-W{w:02d}"


def parse_week(text: str) -> str:
    """`2026-W48`, `2026W48`, `2026-w5` -> `2026-W48` / `2026-W05`; WeekError when not a real ISO week."""
    m = _WEEK_RE.match(text.strip())
    if not m:
        raise WeekError(f"not an ISO week: {text!r} (expected e.g. 2026-W48)")
    y, w = int(m.group(1)), int(m.group(2))
    if y < FIRST_YEAR:
        raise WeekError(f"not a week of a recorded run: {text!r} (weeks start at {FIRST_YEAR}-W01)")
    try:
        date.fromisocalendar(y, w, 1)
    except ValueError:
        raise WeekError(f"not an ISO week: {text!r} ({y} has no week {w})") from None
    return f"{y:04d}-W{w:02d}"


def week_start(week: str) -> datetime:
    """Monday 00:00 UTC of the week."""
    y, w = int(week[:4]), int(week[6:])
    return datetime.combine(date.fromisocalendar(y, w, 1), datetime.min.time(), tzinfo=UTC)


def shift(week: str, weeks: int) -> str:
    return week_of(week_start(week) + timedelta(weeks=weeks))


def previous(week: str, n: int) -> list[str]:
    """The n weeks before `week`, oldest first."""
    return [shift(week, -k) for k in range(n, 0, -1)]


def in_week(when: datetime, week: str) -> bool:
    return week_of(when) == week


def parse_time(text: str) -> datetime:
    """ISO date or datetime; naive means UTC."""
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise WeekError(f"not an ISO date/time: {text!r} (expected e.g. 2026-11-24 or 2026-11-24T10:00:00Z)") from None
    dt = dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    if dt.astimezone(UTC).year < FIRST_YEAR:
        raise WeekError(f"not the time of a recorded run: {text!r} (times start at {FIRST_YEAR}-01-01 UTC)")
    return dt


def utc(dt: datetime | None) -> datetime | None:
    """Datetimes read back from SQLite are naive: they are UTC."""
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)
