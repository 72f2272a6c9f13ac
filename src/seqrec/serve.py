"""The HTTP service: a thin adapter over `Recommender` (FastAPI + uvicorn, the `serve` extra).

    seqrec serve runs/sasrec [--host 127.0.0.1] [--port 8000] [--workers 1]

    POST /recommend        {"history": [1193, 661], "k": 10, "exclude_seen": true,
                            "candidates": null}
                        -> {"items": [{"item", "score", "title"?}], "dropped": [unknown ids]}
    POST /recommend/batch  {"histories": [[...], ...], "k": 10, "exclude_seen": true}
                        -> {"results": [{"items": [...], "dropped": [...]}, ...]}
    GET  /health           {"status": "ok"}
    GET  /model            model, dataset, metrics, version
    GET  /docs             OpenAPI documentation

Bad requests get a 4xx whose `detail` says what was wrong: malformed JSON or wrong types (422),
k outside 1..catalogue (422), a history longer than `max_history` (413), unknown items under
`--unknown reject` (422). The model is loaded once; requests are served concurrently.
"""

# No `from __future__ import annotations`: FastAPI reads the request models of the endpoints
# below from their annotations, and those models are local to create_app.

import os
from pathlib import Path
from typing import Any

from seqrec.errors import ConfigError
from seqrec.recommender import Recommender, UnknownItemsError

__all__ = ["create_app", "serve"]

RUN_ENV = "SEQREC_SERVE_RUN"  # how `--workers N` processes learn what to load
UNKNOWN_ENV = "SEQREC_SERVE_UNKNOWN"
MAX_HISTORY_ENV = "SEQREC_SERVE_MAX_HISTORY"
MAX_BATCH = 1024  # histories per /recommend/batch request


def _imports() -> tuple[Any, Any, Any]:
    try:
        import fastapi
        import pydantic
        import uvicorn
    except ImportError:
        raise ConfigError(
            "seqrec serve needs FastAPI and uvicorn: pip install 'seqrec[serve]'"
        ) from None
    return fastapi, pydantic, uvicorn


def create_app(rec: Recommender, *, max_history: int = 10_000) -> Any:
    """A FastAPI app serving `rec`."""
    _imports()  # a clear error when the extra is missing
    import fastapi
    import pydantic

    from seqrec import __version__

    Item = int | str
    n_items = rec.n_items

    class RecommendRequest(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        history: list[Item] = pydantic.Field(description="item ids, oldest first")
        k: int = pydantic.Field(10, ge=1, le=n_items, description=f"1..{n_items}")
        exclude_seen: bool = True
        candidates: list[Item] | None = None

    class BatchRequest(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        histories: list[list[Item]] = pydantic.Field(max_length=MAX_BATCH)
        k: int = pydantic.Field(10, ge=1, le=n_items, description=f"1..{n_items}")
        exclude_seen: bool = True

    app = fastapi.FastAPI(
        title="seqrec",
        version=__version__,
        description=f"Top-k recommendations from {rec.run.config.model} ({rec.run.path.name})",
    )

    def check_length(history: list[Any]) -> None:
        if len(history) > max_history:
            raise fastapi.HTTPException(
                413, f"history has {len(history)} items; this server accepts at most {max_history}"
            )

    def encode(history: list[Any]) -> Any:
        try:
            return rec.encode(history)
        except UnknownItemsError as e:
            raise fastapi.HTTPException(422, str(e)) from None

    def items(recs: list[tuple[Any, float]]) -> list[dict[str, Any]]:
        out = []
        for item, score in recs:
            row: dict[str, Any] = {"item": item, "score": score}
            meta = rec.describe(item)
            if meta is not None:
                row.update(meta)
            out.append(row)
        return out

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/model")
    def model() -> dict[str, Any]:
        return {**rec.info(), "version": __version__}

    @app.post("/recommend")
    def recommend(req: RecommendRequest) -> dict[str, Any]:
        check_length(req.history)
        enc = encode(req.history)
        try:
            (recs,) = rec.recommend_encoded(
                [enc.ids], req.k, req.exclude_seen, candidates=req.candidates
            )
        except UnknownItemsError as e:  # among the candidates
            raise fastapi.HTTPException(422, f"candidates: {e}") from None
        return {"items": items(recs), "dropped": enc.unknown}

    @app.post("/recommend/batch")
    def recommend_batch(req: BatchRequest) -> dict[str, Any]:
        for h in req.histories:
            check_length(h)
        encoded = [encode(h) for h in req.histories]
        recs = rec.recommend_encoded([e.ids for e in encoded], req.k, req.exclude_seen)
        return {
            "results": [
                {"items": items(r), "dropped": e.unknown}
                for r, e in zip(recs, encoded, strict=True)
            ]
        }

    return app


def app_from_env() -> Any:
    """The app factory of each `--workers` process: the run comes from the environment."""
    run = os.environ.get(RUN_ENV)
    if not run:
        raise ConfigError(f"{RUN_ENV} is not set")
    rec = Recommender.from_run(run, unknown=os.environ.get(UNKNOWN_ENV, "drop"))  # type: ignore[arg-type]
    return create_app(rec, max_history=int(os.environ.get(MAX_HISTORY_ENV, "10000")))


def serve(
    run_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    unknown: str = "drop",
    max_history: int = 10_000,
    log_level: str = "info",
) -> None:
    """Load the run once (per worker process) and serve it until interrupted."""
    _, _, uvicorn = _imports()
    if workers > 1:  # each process loads the run itself
        os.environ[RUN_ENV] = str(Path(run_dir).resolve())
        os.environ[UNKNOWN_ENV] = unknown
        os.environ[MAX_HISTORY_ENV] = str(max_history)
        uvicorn.run(
            "seqrec.serve:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
        )
        return
    rec = Recommender.from_run(run_dir, unknown=unknown)  # type: ignore[arg-type]
    uvicorn.run(create_app(rec, max_history=max_history), host=host, port=port, log_level=log_level)
