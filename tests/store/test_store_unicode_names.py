"""Names that print the same are one name: `café` typed as e + U+0301 (NFD: macOS file names, some keyboards) and
as U+00E9 (NFC) were two teams (recording a job under the other spelling was refused as a team change between
two names that print the same) and two jobs; the store keeps and looks them up in NFC, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import unicodedata

from zoomer_ar.cli import main
from zoomer_ar.store.digest import build_digest
from zoomer_ar.store.history import job_history
from zoomer_ar.store.record import RecordOptions, record_analysis

from store_support import make_analysis, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures

NFC_TEAM = unicodedata.normalize("NFC", "équipe café")
NFD_TEAM = unicodedata.normalize("NFD", NFC_TEAM)
NFD_JOB = unicodedata.normalize("NFD", "entraînement-π")


def test_one_team_and_one_job_whatever_the_spelling(store_url, tmp_path, capsys):
    assert NFC_TEAM != NFD_TEAM
    record_analysis(make_analysis(NFD_JOB, key="a", findings={"idle-gpu": 10.0}),
                    RecordOptions(team=NFD_TEAM, gpu_hours=10.0, week="2026-W10"), db=store_url)
    f = tmp_path / "findings.json"
    f.write_text(make_analysis(unicodedata.normalize("NFC", NFD_JOB), key="b",
                               findings={"idle-gpu": 20.0}).model_dump_json())
    assert main(["record", str(f), "--db", store_url, "--team", NFC_TEAM, "--gpu-hours", "10",
                 "--week", "2026-W10"]) == 0, capsys.readouterr().err  # was: belongs to team 'équipe café'
    capsys.readouterr()
    for team in (NFC_TEAM, NFD_TEAM):
        d = build_digest(store_url, team=team)
        assert (d.week, d.runs, len(d.jobs)) == ("2026-W10", 2, 1), (team, d.runs, d.jobs)
        assert d.jobs[0].team == NFC_TEAM and d.jobs[0].job == unicodedata.normalize("NFC", NFD_JOB)
    assert main(["digest", "--db", store_url, "--team", NFD_TEAM, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == 2
    assert len(job_history(NFD_JOB, store_url).runs) == 2
    assert main(["history", NFD_JOB, "--db", store_url, "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2
