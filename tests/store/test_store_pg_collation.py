"""The digest orders rows of equal waste by name the same way on SQLite and on a PostgreSQL database with a
language collation (en_US, ICU: the usual for a server's databases; the test server's is C): there the names came
as alice, Bob, Zed, on SQLite as Bob, Zed, alice, and --top cut another set of jobs, owners and resolved rows."""

from __future__ import annotations

import uuid

import pytest

from zoomer_ar.cli import main
from zoomer_ar.store.digest import build_digest
from zoomer_ar.store.record import RecordOptions, record_analysis

from store_support import fresh_pg_database, make_analysis, pg_server_url, sqlite_url  # noqa: F401 - fixtures

NAMES = ["alice", "Bob", "Zed", "émile", "eve"]


@pytest.fixture
def pg_icu_url(pg_server_url):
    """A fresh PostgreSQL database collating in ICU's en-US (skipped where the server has no ICU)."""
    with fresh_pg_database(pg_server_url, f"zt_icu_{uuid.uuid4().hex[:12]}",
                           "TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'",
                           skip_if_refused="no ICU collation on this PostgreSQL server") as url:
        yield url


def _seed(url: str) -> None:
    for name in NAMES:  # the same waste everywhere: only the names order the rows
        record_analysis(make_analysis(name, key=f"{name}-1", findings={"idle-gpu": 10.0}),
                        RecordOptions(owner=name, gpu_hours=10.0, gpu_hour_cost=1.0, week="2026-W09"), db=url)
        record_analysis(make_analysis(name, key=f"{name}-2", findings={"launch-bound": 10.0}),
                        RecordOptions(gpu_hours=10.0, week="2026-W10"), db=url)


def test_rows_of_equal_waste_come_in_one_order_on_both_stores(sqlite_url, pg_icu_url, capsys):
    orders = {}
    for url in (sqlite_url, pg_icu_url):
        _seed(url)
        d = build_digest(url, week="2026-W10", top=3)
        orders[url] = ([j.job for j in d.jobs], [o.owner for o in d.owners], [r.job for r in d.resolved])
        assert main(["history", "nobody", "--db", url]) == 2
        orders[url] += (capsys.readouterr().err,)
    expected = sorted(NAMES)[:3]  # code-point order: Bob, Zed, alice
    assert orders[sqlite_url][:3] == (expected, expected, expected)
    assert orders[pg_icu_url] == orders[sqlite_url]
