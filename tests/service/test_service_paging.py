"""GET /v1/jobs pages: keyset paging on (queued_at, id), newest first, on a real server.

Walking a team's jobs in pages of 2 or 3 (`next` as `before`, or `next_url`) returns every job once, in the
order of the store, while new jobs are queued meanwhile (they sort before the walk's first page) and when jobs
share one queued_at (the id breaks the tie); the `state` filter pages the same way; a cursor the API did not
make is a one-line 422.
"""

from __future__ import annotations

import base64

from service_testutil import Server, upload
from sqlalchemy import select, update

from zoomer_ar.store.db import open_store, read_session, write_session
from zoomer_ar.store.service_tables import ServiceJob

NOT_A_TRACE = b'{"not": "a trace"}'


def _walk(client, limit: int, *, state: str | None = None, via_url: bool = False, during=None):  # noqa: ANN001
    """Every page of the team's jobs: (ids in order, number of pages)."""
    seen: list[str] = []
    params: dict[str, object] = {"limit": limit, **({"state": state} if state else {})}
    r = client.get("/v1/jobs", params=params)
    pages = 0
    while True:
        assert r.status_code == 200, r.text
        body = r.json()
        pages += 1
        assert 0 < len(body["jobs"]) <= limit or (pages == 1 and not body["jobs"]), body
        seen += [j["id"] for j in body["jobs"]]
        if body["next"] is None:
            assert body["next_url"] is None
            return seen, pages
        assert len(body["jobs"]) == limit  # a page short of the limit is the last
        if during is not None:
            during(pages)
        if via_url:
            assert body["next_url"].startswith("/v1/jobs?")
            r = client.get(body["next_url"])
        else:
            r = client.get("/v1/jobs", params={**params, "before": body["next"]})


def _store_order(db: str, team_jobs: set[str]) -> list[str]:
    with read_session(open_store(db)) as s:
        rows = s.execute(select(ServiceJob.id).order_by(ServiceJob.queued_at.desc(), ServiceJob.id.desc())).scalars()
        return [j for j in rows if j in team_jobs]


def test_walk_all_jobs_in_pages(tmp_path):
    srv = Server(tmp_path / "srv", embedded_workers=0, args=("--max-team-jobs", "0"))
    try:
        mine, theirs = srv.client(srv.token("ops")), srv.client(srv.token("other"))
        ids = [upload(mine, trace=NOT_A_TRACE, names={"trace": f"t{i}.json"}).json()["id"] for i in range(11)]
        for _ in range(2):
            assert upload(theirs, trace=NOT_A_TRACE, names={"trace": "x.json"}).status_code == 202
        # four jobs queued at the same instant (as PostgreSQL's clock can tie): the id orders them
        with write_session(open_store(srv.db)) as s:
            at = s.execute(select(ServiceJob.queued_at).where(ServiceJob.id == ids[5])).scalar_one()
            s.execute(update(ServiceJob).where(ServiceJob.id.in_(ids[3:7])).values(queued_at=at))
        expected = _store_order(srv.db, set(ids))
        assert sorted(expected) == sorted(ids)

        added: list[str] = []

        def queue_more(page: int) -> None:  # new jobs arrive while the client walks
            if page <= 2:
                added.append(upload(mine, trace=NOT_A_TRACE, names={"trace": "new.json"}).json()["id"])

        for limit in (2, 3):
            added.clear()
            before_walk = _store_order(srv.db, set(ids) | set(_all_ids(mine)))
            walked, pages = _walk(mine, limit, during=queue_more)
            assert walked == before_walk, "every job once, newest first, none of those queued meanwhile"
            assert len(set(walked)) == len(walked) and set(ids) <= set(walked)
            assert pages == -(-len(before_walk) // limit)
            assert added and not set(added) & set(walked)
        everything = _all_ids(mine)
        assert len(everything) == 11 + 4 and _walk(mine, 3, via_url=True)[0] == everything

        # the state filter pages too: 5 cancelled jobs in pages of 2
        cancelled = ids[2:7]
        for jid in cancelled:
            assert mine.post(f"/v1/jobs/{jid}/cancel").json()["state"] == "cancelled"
        walked, pages = _walk(mine, 2, state="cancelled")
        assert walked == [j for j in everything if j in cancelled] and pages == 3
        walked, pages = _walk(mine, 2, state="queued", via_url=True)
        assert sorted(walked) == sorted(set(everything) - set(cancelled)) and pages == 5

        # the other team's walk holds its two jobs only; an exact page ends the walk
        walked, pages = _walk(theirs, 2)
        assert len(walked) == 2 and pages == 1 and not set(walked) & set(everything)

        for bad in ("garbage", "", base64.urlsafe_b64encode(b"1.5 not-an-id").decode(),
                    base64.urlsafe_b64encode(b"nan " + b"a" * 32).decode(), "x" * 201):
            r = mine.get("/v1/jobs", params={"before": bad})
            assert r.status_code == 422, (bad, r.text)
            detail = r.json()["detail"]
            assert detail.startswith("before: ") and "\n" not in detail, detail
        mine.close()
        theirs.close()
    finally:
        srv.stop()


def _all_ids(client) -> list[str]:  # noqa: ANN001
    r = client.get("/v1/jobs", params={"limit": 500})
    assert r.status_code == 200 and r.json()["next"] is None, r.text
    return [j["id"] for j in r.json()["jobs"]]
