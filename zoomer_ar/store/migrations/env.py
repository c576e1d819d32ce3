"""Alembic environment: runs on the connection handed over by zoomer_ar.store.db.upgrade, else on sqlalchemy.url."""

from __future__ import annotations

from alembic import context

from zoomer_ar.store.orm import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:  # noqa: ANN001
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from zoomer_ar.store.db import get_engine

    engine = get_engine(config.get_main_option("sqlalchemy.url"))
    with engine.execution_options(zoomer_write=True).begin() as conn:
        _run(conn)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
