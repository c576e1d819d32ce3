"""Alembic migrations of the store (run by zoomer_ar.store.db.upgrade, or `zoomer-ar db upgrade`)."""
