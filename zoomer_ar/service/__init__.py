"""The analysis service: an HTTP API (FastAPI on uvicorn), a job queue in the store, workers, and
batch analysis on Dask.

    zoomer-ar token create --team vision          # prints an API token once
    zoomer-ar serve --port 8080                   # the API (+ one embedded worker on SQLite)
    zoomer-ar worker                              # more workers (PostgreSQL: as many as you like)
    zoomer-ar batch runs/*/ --scheduler tcp://dask-scheduler:8786

Modules: config (settings), archives (safe extraction), uploads (streamed multipart), auth
(hashed team tokens), queue (claim/lease/complete in the store), worker, webhook (GitHub), app
(the FastAPI app), batch (Dask), cli. See docs/service.md.
"""
