"""API tokens: random, shown once, stored as their sha256; each token belongs to one team.

A token is `zat_` + 43 URL-safe characters (32 random bytes). The store keeps sha256(token) (hex)
and the first 12 characters for listings, never the token. Requests send
`Authorization: Bearer <token>`; the token's team scopes everything the request sees.

Team names are 1-64 characters from `A-Z a-z 0-9 . _ -`, starting with a letter or digit
(TEAM_NAME): no `/` (the store records a team's jobs as `<team>/<job>`, so a team `ml/resnet`
could collide with team `ml`'s job `resnet/...`), no spaces, no control characters.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Engine, select, update

from ..store.db import read_session, with_retry, write_session
from ..store.service_tables import ServiceTeam, ServiceToken

TOKEN_PREFIX = "zat_"
TEAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
TEAM_RULE = "1-64 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"


def check_team_name(name: str) -> str:
    """The team name, stripped; ValueError (one line) when it is empty or not of TEAM_NAME's characters."""
    name = (name or "").strip()
    if not name:
        raise ValueError("team name is empty")
    if not TEAM_NAME.fullmatch(name):
        raise ValueError(f"team name {name!r} is not allowed: use {TEAM_RULE} (no '/', spaces or control characters)")
    return name


@dataclass(frozen=True)
class Principal:
    """Who a request is: the token's id and name, and its team."""

    token_id: int
    token_name: str
    team_id: int
    team: str

    @property
    def author(self) -> str:
        return f"{self.team}/{self.token_name or f'token-{self.token_id}'}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def ensure_team(engine: Engine, name: str) -> int:
    """The team's id, creating it when new; ValueError for a name check_team_name refuses."""
    name = check_team_name(name)

    def tx() -> int:
        with write_session(engine) as s:
            tid = s.execute(select(ServiceTeam.id).where(ServiceTeam.name == name)).scalar_one_or_none()
            if tid is None:
                team = ServiceTeam(name=name)
                s.add(team)
                s.flush()
                tid = team.id
            return tid

    return with_retry(tx)


def create_token(engine: Engine, team: str, name: str = "") -> tuple[str, int]:
    """A new token for `team` (created if new): (the token, shown only now; its id)."""
    team_id = ensure_team(engine, team)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)

    def tx() -> int:
        with write_session(engine) as s:
            row = ServiceToken(team_id=team_id, name=name, token_hash=hash_token(token), prefix=token[:12])
            s.add(row)
            s.flush()
            return row.id

    return token, with_retry(tx)


def authenticate(engine: Engine, token: str | None) -> Principal | None:
    """The principal for a presented token; None when missing, unknown or revoked."""
    if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = hash_token(token)
    with read_session(engine) as s:
        row = s.execute(
            select(ServiceToken.id, ServiceToken.name, ServiceToken.token_hash, ServiceToken.revoked_at,
                   ServiceTeam.id, ServiceTeam.name)
            .join(ServiceTeam, ServiceTeam.id == ServiceToken.team_id)
            .where(ServiceToken.token_hash == digest)
        ).first()
    if row is None or row[3] is not None or not secrets.compare_digest(row[2], digest):
        return None
    return Principal(token_id=row[0], token_name=row[1], team_id=row[4], team=row[5])


def list_tokens(engine: Engine, team: str | None = None) -> list[dict]:
    with read_session(engine) as s:
        q = (select(ServiceToken, ServiceTeam.name).join(ServiceTeam, ServiceTeam.id == ServiceToken.team_id)
             .order_by(ServiceToken.id))
        if team:
            q = q.where(ServiceTeam.name == team)
        return [{"id": t.id, "team": team_name, "name": t.name, "prefix": t.prefix,
                 "created_at": t.created_at.isoformat() if t.created_at else None,
                 "revoked": t.revoked_at is not None} for t, team_name in s.execute(q)]


def token_state(engine: Engine, token_id: int) -> str | None:
    """'active', 'revoked', or None when there is no token with this id."""
    with read_session(engine) as s:
        row = s.execute(select(ServiceToken.revoked_at).where(ServiceToken.id == token_id)).first()
    if row is None:
        return None
    return "active" if row[0] is None else "revoked"


def revoke_token(engine: Engine, token_id: int) -> bool:
    def tx() -> bool:
        with write_session(engine) as s:
            res = s.execute(update(ServiceToken).where(ServiceToken.id == token_id, ServiceToken.revoked_at.is_(None))
                            .values(revoked_at=time.time()))
            return res.rowcount == 1

    return with_retry(tx)
