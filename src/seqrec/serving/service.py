"""The HTTP service: a thin adapter over `Recommender` (FastAPI + uvicorn, the `serve` extra).

    seqrec serve runs/sasrec [--host 127.0.0.1] [--port 8000] [--workers 1]
        [--api-key-env NAME] [--max-body 1000000] [--max-batch 1024] [--timeout 10]
        [--cors-origin URL ...] [--exclude-items FILE] [--exact | --search-breadth N]

    POST /recommend        {"history": [1193, 661], "k": 10, "exclude_seen": true,
                            "candidates": null, "exclude": null}, or {"user": 42, "k": 10}
                        -> {"items": [{"item", "score", "title"?}], "dropped": [unknown ids],
                            "scored_by": "model" | "popularity" (an empty history)}
    POST /recommend/batch  {"histories": [[...], ...], "k": 10, "exclude_seen": true,
                            "exclude": null}
                        -> {"results": [{"items": [...], "dropped": [...], "scored_by"}, ...]}
    GET  /health           liveness: the process answers ({"status": "ok"})
    GET  /ready            readiness: the model is loaded and has scored ({"status": "ready"})
    POST /items            {"items": [{"item": 4242, "genres": "Comedy", ...}, ...]}: new items
                           scored from their features (a run trained with item features),
                           recorded in the run directory -> {"added": [ids], "n_items"}.
                           One writer at a time (the run's lock): every process of
                           --workers N, and a server beside `seqrec add-items`, loads the
                           catalogue again when another changed it (checked every second)
    GET  /model            model, dataset, metrics, version, micro-batching counts
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
answers a valid POST /recommend itself, past FastAPI's routing (the same model of the request,
the same answer); what it refuses goes on to the app, which says why.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqrec.errors import ConfigError, SeqrecError
from seqrec.serving import routes
from seqrec.serving.catalogue import follow
from seqrec.serving.recommender import Recommender

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
    # POST /items: the added items are recorded in the run directory (False: this process only)
    save_items: bool = True
    # every item scored, even where the run has an item index (seqrec.serving.index)
    exact: bool = False
    # how widely the item index is searched: its ef_search (a graph) or nprobe (lists); 0: as
    # it was built (`seqrec index` chose it for a recall target)
    search_breadth: int = 0


_OPEN = ("/health", "/ready")  # answered without a token: what probes call


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

        routes.DEADLINE.set(time.monotonic() + o.timeout)
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
    _set_breadth(rec, opts)
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
    rec.recommend_batch([[]], k=1, times=[[]])  # a first scoring: /ready means the model answers
    if rec.run.items is not None and opts.save_items and rec.stamp is not None:
        follow(rec)  # a catalogue that grows: another worker's or add-items' items, in a second
    schemas = routes.schemas(rec, opts)

    @app.get("/health", response_model=schemas.Status)
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", response_model=schemas.Status)
    def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/model")
    def model() -> dict[str, Any]:
        # micro_batching: the one-history requests' batches so far (routes.recommend_routes)
        stats = app.state.batcher.stats()
        return {**rec.info(), "version": __version__, "micro_batching": stats}

    @app.post("/items")
    def add_items(body: dict[str, Any] = fastapi.Body(...)) -> dict[str, Any]:  # noqa: B008
        rows = body.get("items")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise fastapi.HTTPException(422, "items: expected a non-empty list of item rows")
        import polars as pl

        try:
            added = rec.add_items(pl.DataFrame(rows), save=opts.save_items)
        except (SeqrecError, pl.exceptions.PolarsError, TypeError, ValueError) as err:
            raise fastapi.HTTPException(422, str(err).splitlines()[0]) from None
        return {"added": added, "n_items": rec.n_items}

    routes.recommend_routes(app, rec, opts, schemas, fast)
    return app


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


def app_from_env() -> Any:
    """The app factory of each `--workers` process: the run comes from the environment."""
    run = os.environ.get(RUN_ENV)
    if not run:
        raise ConfigError(f"{RUN_ENV} is not set")
    raw = json.loads(os.environ.get(OPTIONS_ENV, "{}"))
    raw["cors_origins"] = tuple(raw.get("cors_origins", ()))
    options = ServeOptions(**raw)
    rec = Recommender.from_run(
        run,
        unknown=os.environ.get(UNKNOWN_ENV, "drop"),  # type: ignore[arg-type]
        trust=bool(os.environ.get(TRUST_ENV)),
        device=os.environ.get(DEVICE_ENV) or "cpu",
        exact=options.exact,
    )
    _set_connection_limits(options)
    _set_threads(options)
    return create_app(rec, options)


def _set_breadth(rec: Recommender, options: ServeOptions) -> None:
    """The item index searched `options.search_breadth` wide (said once without an index)."""
    if not options.search_breadth:
        return
    if rec.index is None:
        print(
            f"{rec.run.path}: no item index in use; --search-breadth has nothing to set",
            file=sys.stderr,
        )
        return
    rec.index.set_breadth(options.search_breadth)


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
    if workers > 1 and not options.save_items:
        raise ConfigError(
            "--workers: items added over POST /items without saving them stay in the process "
            "that took them; serve one worker, or let the run record them"
        )
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
        exact=options.exact,
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
