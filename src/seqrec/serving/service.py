"""The HTTP service: a thin adapter over `Recommender` (FastAPI + uvicorn, the `serve` extra).

    seqrec serve runs/sasrec [--host 127.0.0.1] [--port 8000] [--workers 1]
        [--api-key-env NAME] [--max-body 1000000] [--max-batch 1024] [--timeout 10]
        [--cors-origin URL ...] [--exclude-items FILE]

    POST /recommend        {"history": [1193, 661], "k": 10, "exclude_seen": true,
                            "candidates": null, "exclude": null}, or {"user": 42, "k": 10}
                        -> {"items": [{"item", "score", "title"?}], "dropped": [unknown ids],
                            "scored_by": "model" | "popularity" (an empty history)}
    POST /recommend/batch  {"histories": [[...], ...], "k": 10, "exclude_seen": true,
                            "exclude": null}
                        -> {"results": [{"items": [...], "dropped": [...], "scored_by"}, ...]}
    GET  /health           liveness: the process answers ({"status": "ok"})
    GET  /ready            readiness: the model is loaded and has scored ({"status": "ready"})
    GET  /model            model, dataset, metrics, version
    GET  /docs             OpenAPI documentation (Swagger UI served by the app: works offline)

`exclude` (per request) and `exclude_items` (ServeOptions, `--exclude-items FILE`: every
request, e.g. items out of stock) are never recommended; `candidates` is the allow-list.

Bad requests get a 4xx whose `detail` says what was wrong: malformed JSON or wrong types (422),
k outside 1..catalogue (422), a history longer than `max_history` or a batch larger than
`max_batch` (413, 422), a body larger than `max_body` (413), unknown items under
`--unknown reject` (422), a missing or wrong bearer token when `--api-key-env` names one (401).
A request running longer than `timeout` gets 504; an unexpected failure gets a 500 whose body
says only that (never a stack trace). CORS is closed unless origins are named. SIGTERM stops
accepting connections and finishes the requests in flight (uvicorn's graceful shutdown). The
model is loaded once; requests are served concurrently, and one-history requests that arrive
together are scored as one batch (seqrec.serving.batching; a full queue is a 503). The guard
answers a
valid POST /recommend itself, past FastAPI's routing (the same model of the request, the same
answer); what it refuses goes on to the app, which says why.
"""

# No `from __future__ import annotations`: FastAPI reads the request models of the endpoints
# below from their annotations, and those models are local to create_app.

import asyncio
import dataclasses
import hmac
import ipaddress
import json
import os
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch

from seqrec.errors import ConfigError
from seqrec.serving.recommender import MODEL, POPULARITY, Recommender, UnknownItemsError

__all__ = ["ServeOptions", "check_host", "create_app", "serve", "server_config"]

RUN_ENV = "SEQREC_SERVE_RUN"  # how `--workers N` processes learn what to load
OPTIONS_ENV = "SEQREC_SERVE_OPTIONS"  # ... and with which options (JSON)
UNKNOWN_ENV = "SEQREC_SERVE_UNKNOWN"
TRUST_ENV = "SEQREC_SERVE_TRUST"  # "1": load a run without a manifest
DEVICE_ENV = "SEQREC_SERVE_DEVICE"  # where each worker scores


@dataclass(frozen=True)
class ServeOptions:
    """What the service accepts and how it protects itself."""

    max_history: int = 10_000  # items per history
    max_batch: int = 1024  # histories per /recommend/batch request
    max_body: int = 1_000_000  # bytes per request body
    timeout: float = 10.0  # seconds a request may run before it gets 504
    api_key: str | None = None  # bearer token every endpoint but /health and /ready needs
    cors_origins: tuple[str, ...] = ()  # none: CORS closed
    # the connection layer (seqrec.serving.guard): open connections (one more evicts the longest
    # idle), seconds to complete a request's headers, keep-alive seconds, requests per connection
    max_connections: int = 1000
    header_timeout: float = 10.0
    keep_alive: float = 5.0
    max_requests: int = 1000
    http: str = "auto"  # the HTTP parser: "httptools" (C, faster), "h11", "auto" (httptools if any)
    # dynamic micro-batching (seqrec.serving.batching): one-history requests queued while the model
    # is busy, or within `batch_wait` seconds, are scored together, at most `micro_batch` at once
    # (1: each alone); more than `max_queue` waiting are refused with 503
    micro_batch: int = 64
    batch_wait: float = 0.001
    max_queue: int = 512
    # torch's intra-op threads for scoring in each worker (0: torch's default, one per core);
    # 1 leaves a core to the event loop, the better split on a small machine (docs/deploy.md)
    threads: int = 0
    # item ids never recommended, whatever the request (out of stock, withdrawn); ids the model
    # does not know are ignored (said once when the app starts)
    exclude_items: tuple[Any, ...] = ()


_OPEN = ("/health", "/ready")  # answered without a token: what probes call


# When the request being served must be answered (time.monotonic()); the endpoints pass it to
# the recommender, which stops between its batches once it has passed: a request that got its
# 504 does not go on computing behind it.
_DEADLINE: ContextVar[float | None] = ContextVar("seqrec_request_deadline", default=None)


class _Guard:
    """ASGI middleware: the bearer token, the body-size cap and the per-request timeout,
    answered as JSON before (or instead of) the app. The body is read here, whole and within
    the cap and the timeout, before the app sees it: a body over the cap is a 413 whether its
    length was announced or it came in chunks."""

    def __init__(self, app: Any, options: ServeOptions, fast: dict[str, Any]) -> None:
        # `fast`: POST routes the guard answers itself, past the app's routing and middleware
        # (body -> (status, JSON), or None: the app answers); not for cross-origin requests
        # (CORS is the app's)
        self.app, self.options, self.fast = app, options, fast

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        o = self.options
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if o.api_key is not None and scope.get("path") not in _OPEN:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, f"Bearer {o.api_key}".encode()):
                return await _json(
                    send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")]
                )
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > o.max_body):
            return await _json(send, 413, f"request body over {o.max_body} bytes")
        started = False

        async def tracking_send(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        async def handle() -> None:
            body = bytearray()
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                body += message.get("body", b"")
                if len(body) > o.max_body:
                    raise _TooLarge
                if not message.get("more_body"):
                    break
            direct = self.fast.get(scope["path"]) if scope["method"] == "POST" else None
            # the fast route takes what the app would read as JSON, and only that: any other
            # body (text/plain, a form) is the app's to refuse, so both paths answer alike
            json_body = _json_content(headers.get(b"content-type"))
            if direct is not None and json_body and b"origin" not in headers:
                try:
                    done = await direct(bytes(body))
                except TimeoutError:  # waited in the queue past its deadline
                    done = 504, {"detail": f"the request took longer than {o.timeout:g} s"}
                except Exception:  # whatever failed, the client learns only that
                    done = 500, {"detail": "internal error"}
                if done is not None:  # else a body the request model refuses: the app says why
                    return await _send_json(tracking_send, *done)
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": bytes(body), "more_body": False}
                return await receive()

            await self.app(scope, replay, tracking_send)

        _DEADLINE.set(time.monotonic() + o.timeout)
        try:
            async with asyncio.timeout(o.timeout):  # in this task: no task per request
                await handle()
        except _TooLarge:
            if not started:
                await _json(send, 413, f"request body over {o.max_body} bytes")
        except TimeoutError:
            if not started:
                await _json(send, 504, f"the request took longer than {o.timeout:g} s")


class _TooLarge(Exception):
    pass


def _shown(value: Any) -> str:
    """An id in an error line: its JSON, cut to 60 characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_content(value: bytes | None) -> bool:
    """Whether a request body of this Content-Type is read as JSON by FastAPI: application/json
    or application/<anything>+json (the fast route takes only these; a body without one is the
    app's to read or refuse, as its version does: newer ones refuse it, strict_content_type)."""
    if value is None:
        return False
    kind = value.split(b";", 1)[0].strip().lower()
    main, _, sub = kind.partition(b"/")
    return main == b"application" and (sub == b"json" or sub.endswith(b"+json"))


async def _json(send: Any, status: int, detail: str, extra: list[Any] | None = None) -> None:
    await _send_json(send, status, {"detail": detail}, extra)


async def _send_json(send: Any, status: int, obj: Any, extra: list[Any] | None = None) -> None:
    body = json.dumps(obj, ensure_ascii=False, allow_nan=False).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": body})


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


def create_app(
    rec: Recommender, options: ServeOptions | None = None, *, max_history: int | None = None
) -> Any:
    """A FastAPI app serving `rec` (`max_history`: a shortcut for that option)."""
    _imports()  # a clear error when the extra is missing
    import fastapi

    from seqrec.provenance import VERSION as __version__

    opts = options or ServeOptions()
    if max_history is not None:
        opts = dataclasses.replace(opts, max_history=max_history)
    unknown = rec.exclude_items(opts.exclude_items)
    if unknown:
        shown = ", ".join(map(str, unknown[:5])) + (" ..." if len(unknown) > 5 else "")
        print(f"exclude_items: {len(unknown)} id(s) not in the catalogue: {shown}", file=sys.stderr)
    app = fastapi.FastAPI(
        title="seqrec",
        version=__version__,
        description=f"Top-k recommendations from {rec.run.config.model} ({rec.run.path.name})",
        docs_url=None,  # served below from the package's copy of Swagger UI, not a CDN
        redoc_url=None,
    )
    _docs_route(app)
    fast: dict[str, Any] = {}  # the guard's direct routes, filled by _recommend_routes
    _install_handlers(app, opts, fast)
    rec.recommend([], k=1)  # a first scoring: /ready means the model answers
    schemas = _schemas(rec, opts)

    @app.get("/health", response_model=schemas.Status)
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", response_model=schemas.Status)
    def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/model")
    def model() -> dict[str, Any]:
        return {**rec.info(), "version": __version__}

    _recommend_routes(app, rec, opts, schemas, fast)
    return app


def _scored_by(ids: Any) -> str:
    """How an answer was scored: by the model, or (an empty history) by popularity."""
    return MODEL if len(ids) else POPULARITY


_DOCS_ASSETS = "/docs/assets"


def _docs_route(app: Any) -> None:
    """GET /docs: Swagger UI over the app's OpenAPI schema, its script and style sheet served
    by the app from the swagger-ui-bundle package (a page that works offline)."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount(_DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> Any:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{_DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{_DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{_DOCS_ASSETS}/favicon-32x32.png",
        )


def _schemas(rec: Recommender, opts: ServeOptions) -> Any:
    """The request and answer models of `rec`'s endpoints (their limits are the catalogue's
    size and the options'), as attributes of one namespace."""
    import types

    import pydantic

    def text(value: str) -> str:
        # a lone surrogate ("\ud800") is valid JSON but no text: refused here (422), not a
        # failure when the answer is encoded
        value.encode("utf-8")
        return value

    Item = int | Annotated[str, pydantic.AfterValidator(text)]
    n_items = rec.n_items

    class RecommendRequest(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        history: list[Item] | None = pydantic.Field(
            None,
            description="item ids, oldest first; none: the known `user`'s history in the "
            "training data",
        )
        k: int = pydantic.Field(10, ge=1, le=n_items, description=f"1..{n_items}")
        exclude_seen: bool = True
        candidates: list[Item] | None = pydantic.Field(
            None, description="rank only these items (an unknown id: 422)"
        )
        exclude: list[Item] | None = pydantic.Field(
            None, description="never these items (ids the model does not know are ignored)"
        )
        user: Item | None = pydantic.Field(
            None,
            description="the user's id in the training data, for models with a per-user term "
            "(BPR-MF, FPMC, Caser); without `history`, that user's training history is scored. "
            "With `history`, an id not there is an anonymous history (the user term is left "
            "out); without it, an unknown id is a 422 that names it",
        )

    example_item = rec.item_ids[0] if rec.item_ids else 1

    class Scored(pydantic.BaseModel):
        item: Item = pydantic.Field(description="an item id of the training data")
        score: float = pydantic.Field(description="the model's score (higher ranks first)")
        title: str | None = pydantic.Field(None, description="from the item metadata, if any")
        genres: list[str] | None = None

    class Recommendations(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(
            json_schema_extra={
                "example": {
                    "items": [{"item": example_item, "score": 3.21}],
                    "dropped": ["an-unknown-id"],
                    "scored_by": "model",
                }
            }
        )
        items: list[Scored] = pydantic.Field(description="the top k, best first")
        dropped: list[Item] = pydantic.Field(description="history ids the model does not know")
        scored_by: str = pydantic.Field(
            description='"model"; "popularity" for an empty history (or one of unknown ids '
            "only): the scores are then the training interaction counts, another scale"
        )
        user_known: bool | None = pydantic.Field(
            None, description="with `user`: whether it is a user of the training data"
        )

    class BatchRecommendations(pydantic.BaseModel):
        results: list[Recommendations] = pydantic.Field(description="one per history, in order")

    class Status(pydantic.BaseModel):
        status: str

    class BatchRequest(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        histories: list[list[Item]] = pydantic.Field(max_length=opts.max_batch)
        k: int = pydantic.Field(10, ge=1, le=n_items, description=f"1..{n_items}")
        exclude_seen: bool = True
        exclude: list[Item] | None = pydantic.Field(
            None, description="never these items, for every history (unknown ids are ignored)"
        )

    return types.SimpleNamespace(
        RecommendRequest=RecommendRequest,
        Recommendations=Recommendations,
        BatchRequest=BatchRequest,
        BatchRecommendations=BatchRecommendations,
        Status=Status,
    )


def _install_handlers(app: Any, opts: ServeOptions, fast: dict[str, Any]) -> None:
    """Errors answered in one JSON line each (never a stack trace), CORS, and the guard."""
    import fastapi
    from fastapi.responses import JSONResponse

    @app.exception_handler(fastapi.exceptions.RequestValidationError)
    async def invalid_request(request: Any, exc: Any) -> Any:
        # what was wrong and where; not the input itself, which may not even be valid JSON to
        # echo (a body of Infinity or NaN)
        errors = [{k: e[k] for k in ("loc", "msg", "type") if k in e} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(TimeoutError)
    async def late(request: Any, exc: Exception) -> Any:
        # the recommender stopped at the request's deadline (the guard's 504, reached first)
        detail = f"the request took longer than {opts.timeout:g} s"
        return JSONResponse({"detail": detail}, status_code=504)

    @app.exception_handler(Exception)
    async def internal_error(request: Any, exc: Exception) -> Any:
        # whatever failed, the client learns only that: no stack trace, no internals
        return JSONResponse({"detail": "internal error"}, status_code=500)

    if opts.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(opts.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(_Guard, options=opts, fast=fast)


def _recommend_routes(
    app: Any, rec: Recommender, opts: ServeOptions, schemas: Any, fast: dict[str, Any]
) -> None:
    """POST /recommend (one history, or a known user by id; micro-batched; also put in `fast`,
    the guard's direct routes) and POST /recommend/batch."""
    import fastapi
    import pydantic
    from fastapi.responses import JSONResponse

    from seqrec.serving.batching import MicroBatcher, Overloaded

    def check_length(history: list[Any]) -> None:
        if len(history) > opts.max_history:
            raise fastapi.HTTPException(
                413,
                f"history has {len(history)} items; this server accepts at most {opts.max_history}",
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

    batcher = MicroBatcher(
        lambda histories, k, exclude_seen, users: rec.recommend_encoded(
            histories, k, exclude_seen, users=users
        ),
        max_size=opts.micro_batch,
        wait=opts.batch_wait,
        max_queue=opts.max_queue,
    )
    app.router.on_shutdown.append(batcher.close)

    async def answer(req: Any) -> dict[str, Any]:
        row = None if req.user is None else rec.user_index(req.user)
        if req.history is not None:
            check_length(req.history)
            enc = encode(req.history)
            ids, dropped = enc.ids, enc.unknown
        elif row is not None and rec.dataset is not None:  # a known user, by id
            ids, dropped = rec.dataset.sequences[row], []
        elif req.user is not None:
            raise fastapi.HTTPException(
                422,
                f"user {_shown(req.user)} is not a user of the training data: give its history "
                "(an unknown user's history is scored as an anonymous one)",
            )
        else:
            raise fastapi.HTTPException(
                422, "give a history, or the id of a user of the training data as user"
            )
        deadline = _DEADLINE.get()
        try:
            if req.candidates is None and req.exclude is None:  # the common request: batched
                user = -1 if row is None else row
                recs = await batcher.recommend(ids, req.k, req.exclude_seen, user, deadline)
            else:
                (recs,) = await batcher.run(
                    lambda: rec.recommend_encoded(
                        [ids],
                        req.k,
                        req.exclude_seen,
                        candidates=req.candidates,
                        exclude=req.exclude,
                        users=None if row is None else [row],
                        deadline=deadline,
                    )
                )
        except UnknownItemsError as e:  # among the candidates
            raise fastapi.HTTPException(422, f"candidates: {e}") from None
        except Overloaded as e:
            raise fastapi.HTTPException(503, f"busy: {e}; retry shortly") from None
        out: dict[str, Any] = {
            "items": items(recs),
            "dropped": dropped,
            "scored_by": _scored_by(ids),
        }
        if req.user is not None:
            out["user_known"] = row is not None
        return out

    async def recommend(req: Any) -> Any:
        # the answer is built to the response model's shape; FastAPI's second validation of it
        # would cost more than scoring (the model stays declared for the OpenAPI schema)
        return JSONResponse(await answer(req))

    async def recommend_fast(body: bytes) -> tuple[int, Any] | None:
        """POST /recommend as the guard serves it, past FastAPI's routing: the same request
        model and the same answer; None for a body the model refuses (the app then answers
        it, in FastAPI's words)."""
        try:
            req = schemas.RecommendRequest.model_validate_json(body)
        except pydantic.ValidationError:
            return None
        try:
            return 200, await answer(req)
        except fastapi.HTTPException as e:
            return e.status_code, {"detail": e.detail}

    fast["/recommend"] = recommend_fast

    async def recommend_batch(req: Any) -> Any:
        for h in req.histories:
            check_length(h)
        encoded = [encode(h) for h in req.histories]
        deadline = _DEADLINE.get()
        recs = await batcher.run(
            lambda: rec.recommend_encoded(
                [e.ids for e in encoded],
                req.k,
                req.exclude_seen,
                exclude=req.exclude,
                deadline=deadline,
            )
        )
        results = [
            {"items": items(r), "dropped": e.unknown, "scored_by": _scored_by(e.ids)}
            for r, e in zip(recs, encoded, strict=True)
        ]
        return JSONResponse({"results": results})

    # the request bodies are models built for this app (their limits are the catalogue's and the
    # options'): given to FastAPI as the parameters' annotations before the routes are added
    recommend.__annotations__["req"] = schemas.RecommendRequest
    recommend_batch.__annotations__["req"] = schemas.BatchRequest
    exclude_none = {"response_model_exclude_none": True}
    app.post("/recommend", response_model=schemas.Recommendations, **exclude_none)(recommend)
    app.post("/recommend/batch", response_model=schemas.BatchRecommendations, **exclude_none)(
        recommend_batch
    )


def app_from_env() -> Any:
    """The app factory of each `--workers` process: the run comes from the environment."""
    run = os.environ.get(RUN_ENV)
    if not run:
        raise ConfigError(f"{RUN_ENV} is not set")
    rec = Recommender.from_run(
        run,
        unknown=os.environ.get(UNKNOWN_ENV, "drop"),  # type: ignore[arg-type]
        trust=bool(os.environ.get(TRUST_ENV)),
        device=os.environ.get(DEVICE_ENV) or "cpu",
    )
    raw = json.loads(os.environ.get(OPTIONS_ENV, "{}"))
    raw["cors_origins"] = tuple(raw.get("cors_origins", ()))
    options = ServeOptions(**raw)
    _set_connection_limits(options)
    _set_threads(options)
    return create_app(rec, options)


def _set_threads(options: ServeOptions) -> None:
    """The serving process's torch threads (its own process: set for good)."""
    if options.threads:
        torch.set_num_threads(options.threads)


def _set_connection_limits(options: ServeOptions) -> None:
    from seqrec.serving.guard import ConnectionLimits, set_limits

    set_limits(
        ConnectionLimits(
            max_connections=options.max_connections,
            header_timeout=options.header_timeout,
            keep_alive=options.keep_alive,
            max_requests=options.max_requests,
        )
    )


def server_config(app: Any, options: ServeOptions, **kwargs: Any) -> Any:
    """The uvicorn config seqrec serves with: its guarded HTTP protocol (seqrec.serving.guard,
    httptools or h11 as `options.http` says) with `options`' connection limits, and uvicorn's
    keep-alive timer."""
    _, _, uvicorn = _imports()
    from seqrec.serving.guard import guarded_protocol

    _set_connection_limits(options)
    return uvicorn.Config(
        app, http=guarded_protocol(options.http), timeout_keep_alive=options.keep_alive, **kwargs
    )


def check_host(host: str, options: ServeOptions, insecure: bool) -> None:
    """A server reachable from other machines needs a token unless told otherwise."""
    if options.api_key is not None or insecure or _loopback(host):
        return
    raise ConfigError(
        f"--host {host}: reachable from other machines, and no --api-key-env names a token; "
        "give one, or --insecure to serve without"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def serve(
    run_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    unknown: str = "drop",
    options: ServeOptions | None = None,
    log_level: str = "info",
    trust: bool = False,
    insecure: bool = False,
    device: str = "cpu",
    access_log: bool = True,
) -> None:
    """Load the run once (per worker process) and serve it until interrupted (SIGINT/SIGTERM:
    in-flight requests finish first) on `device`. A `host` other than the loopback needs a
    token in `options` unless `insecure`. `access_log`: a line per request (uvicorn's)."""
    _, _, uvicorn = _imports()
    from seqrec.serving.guard import guarded_protocol

    options = options or ServeOptions()
    check_host(host, options, insecure)
    if workers > 1:  # each process loads the run itself
        os.environ[RUN_ENV] = str(Path(run_dir).resolve())
        os.environ[UNKNOWN_ENV] = unknown
        os.environ[TRUST_ENV] = "1" if trust else ""
        os.environ[DEVICE_ENV] = device
        os.environ[OPTIONS_ENV] = json.dumps(dataclasses.asdict(options))
        uvicorn.run(
            "seqrec.serving.service:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            access_log=access_log,
            http=guarded_protocol(options.http),
            timeout_keep_alive=options.keep_alive,
        )
        return
    rec = Recommender.from_run(
        run_dir,
        unknown=unknown,  # type: ignore[arg-type]
        trust=trust,
        device=device,
    )
    _set_threads(options)
    config = server_config(
        create_app(rec, options),
        options,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
    )
    uvicorn.Server(config).run()
