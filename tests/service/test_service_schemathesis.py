"""Schemathesis against the published schema (docs/openapi.json) on a live server: no 5xx, and responses conform
to the schema (status codes, content types, bodies). Bounded: a few examples per operation (< 60 s)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from service_testutil import EXAMPLE_DL, REPO, Server, trace_file, upload, wait_job

schema = schemathesis.openapi.from_path(REPO / "docs" / "openapi.json")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("fuzz"), args=("--max-upload-mb", "2", "--webhook-secret", "fuzz"))
    tok = s.token("fuzz")
    with s.client(tok) as c:  # one finished job, so result routes have something to serve
        r = upload(c, trace=trace_file(EXAMPLE_DL))
        wait_job(c, r.json()["id"], server=s)
    yield s, tok
    s.stop()


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms_and_never_fails(case, live):
    server, tok = live
    headers = {"Authorization": f"Bearer {tok}"}
    case.call_and_validate(base_url=server.url, headers=headers, checks=CHECKS, timeout=60)
