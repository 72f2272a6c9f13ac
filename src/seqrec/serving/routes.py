"""The HTTP endpoints that recommend: the request and answer models of a served run (their
limits are its catalogue's and the server's options') and the routes that answer them."""

from __future__ import annotations

import json
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Annotated, Any

from seqrec.serving.recommender import MODEL, POPULARITY, Recommender, UnknownItemsError
from seqrec.serving.scoring import seconds

if TYPE_CHECKING:
    from seqrec.serving.service import ServeOptions

__all__ = ["recommend_routes", "schemas"]

# When the request being served must be answered (time.monotonic(), set by the guard); the
# endpoints pass it to the recommender, which stops between its batches once it has passed: a
# request that got its 504 does not go on computing behind it.
DEADLINE: ContextVar[float | None] = ContextVar("seqrec_request_deadline", default=None)


def _shown(value: Any) -> str:
    """An id in an error line: its JSON, cut to 60 characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _scored_by(ids: Any) -> str:
    """How an answer was scored: by the model, or (an empty history) by popularity."""
    return MODEL if len(ids) else POPULARITY


def schemas(rec: Recommender, opts: ServeOptions) -> Any:
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
        timestamps: list[int] | None = pydantic.Field(
            None,
            description="when each `history` item happened, seconds since the epoch, one per "
            "item: a model of time (HSTU's time bias) needs them, the others ignore them",
        )
        at: int | None = pydantic.Field(
            None, description="the time the recommendation is for, seconds (default: now)"
        )

    class BatchRequest(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        histories: list[list[Item]] = pydantic.Field(max_length=opts.max_batch)
        k: int = pydantic.Field(10, ge=1, le=n_items, description=f"1..{n_items}")
        exclude_seen: bool = True
        exclude: list[Item] | None = pydantic.Field(
            None, description="never these items, for every history (unknown ids are ignored)"
        )
        timestamps: list[list[int]] | None = pydantic.Field(
            None,
            max_length=opts.max_batch,
            description="each history's times, seconds, one per item (a model of time needs them)",
        )
        at: int | None = pydantic.Field(
            None, description="the time the recommendations are for, seconds (default: now)"
        )

    return types.SimpleNamespace(
        RecommendRequest=RecommendRequest,
        BatchRequest=BatchRequest,
        **vars(_answers(rec, Item)),
    )


def _answers(rec: Recommender, Item: Any) -> Any:  # noqa: N803 (a type, named as one)
    """The answer models of `rec`'s endpoints, as attributes of one namespace."""
    import types

    import pydantic

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

    return types.SimpleNamespace(
        Recommendations=Recommendations, BatchRecommendations=BatchRecommendations, Status=Status
    )


def _clock(rec: Recommender, enc: Any, times: list[int] | None, at: int | None, what: str) -> Any:
    """(the kept items' times, the query time) of an encoded history `enc` for a model of time
    (a 422 naming `what` when they are missing or not whole seconds); None for the others."""
    import fastapi

    if not rec.model.uses_times:
        return None
    if times is None:
        raise fastapi.HTTPException(
            422, f"this model reads when each item happened: give {what}, one per item"
        )
    n = len(enc.ids) + len(enc.unknown)
    if len(times) != n:
        raise fastapi.HTTPException(422, f"{what}: {len(times)} times for {n} items")
    try:
        kept = seconds(times, what)
    except ValueError as e:
        raise fastapi.HTTPException(422, str(e)) from None
    return kept if enc.kept is None else kept[enc.kept], _query_time(at)


def _query_time(at: int | None) -> int:
    """The time a recommendation is for: `at`, checked (a 422), or now."""
    import fastapi

    try:
        return int(seconds(int(time.time()) if at is None else at, "at"))
    except ValueError as e:
        raise fastapi.HTTPException(422, str(e)) from None


def _items(rec: Recommender, recs: list[tuple[Any, float]]) -> list[dict[str, Any]]:
    """An answer's items: each item and its score, with its metadata where known."""
    out = []
    for item, score in recs:
        row: dict[str, Any] = {"item": item, "score": score}
        meta = rec.describe(item)
        if meta is not None:
            row.update(meta)
        out.append(row)
    return out


def _batch_clocks(rec: Recommender, req: Any, encoded: list[Any]) -> list[Any]:
    """`_clock` of each history of a batch request (a 422 when its timestamps are not one
    list a history)."""
    import fastapi

    if req.timestamps is not None and len(req.timestamps) != len(encoded):
        raise fastapi.HTTPException(
            422, f"timestamps: {len(req.timestamps)} lists for {len(encoded)} histories"
        )
    stamps = req.timestamps or [None] * len(encoded)
    return [
        _clock(rec, e, t, req.at, f"timestamps[{i}]")
        for i, (e, t) in enumerate(zip(encoded, stamps, strict=True))
    ]


def _answerer(rec: Recommender, opts: ServeOptions, batcher: Any) -> Any:
    """The answer to one POST /recommend request (a history, or a known user by id), and the
    helpers the batch route shares: (answer, check_length, encode, items)."""
    import fastapi

    from seqrec.serving.batching import Overloaded

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
        return _items(rec, recs)

    async def answer(req: Any) -> dict[str, Any]:
        row = None if req.user is None else rec.user_index(req.user)
        if req.history is not None:
            check_length(req.history)
            enc = encode(req.history)
            ids, dropped = enc.ids, enc.unknown
            when = _clock(rec, enc, req.timestamps, req.at, "timestamps")
        elif row is not None and rec.dataset is not None:  # a known user, by id
            ids, dropped = rec.dataset.sequences[row], []
            times = rec.user_times([row])  # a model of time: the user's own
            when = None if times is None else (times[0], _query_time(req.at))
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
        deadline = DEADLINE.get()
        try:
            if req.candidates is None and req.exclude is None:  # the common request: batched
                user = -1 if row is None else row
                recs = await batcher.recommend(ids, req.k, req.exclude_seen, user, deadline, when)
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
                        times=None if when is None else [when[0]],
                        at=None if when is None else [when[1]],
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

    return answer, check_length, encode, items


def recommend_routes(
    app: Any, rec: Recommender, opts: ServeOptions, schemas: Any, fast: dict[str, Any]
) -> None:
    """POST /recommend (one history, or a known user by id; micro-batched; also put in `fast`,
    the guard's direct routes) and POST /recommend/batch."""
    import fastapi
    import pydantic
    from fastapi.responses import JSONResponse

    from seqrec.serving.batching import MicroBatcher

    batcher = MicroBatcher(
        lambda histories, k, exclude_seen, users, times, at: rec.recommend_encoded(
            histories, k, exclude_seen, users=users, times=times, at=at
        ),
        max_size=opts.micro_batch,
        wait=opts.batch_wait,
        max_queue=opts.max_queue,
    )
    app.router.on_shutdown.append(batcher.close)
    app.state.batcher = batcher  # GET /model reports its stats

    answer, check_length, encode, items = _answerer(rec, opts, batcher)

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
        clocks = _batch_clocks(rec, req, encoded)
        timed = rec.model.uses_times
        deadline = DEADLINE.get()
        recs = await batcher.run(
            lambda: rec.recommend_encoded(
                [e.ids for e in encoded],
                req.k,
                req.exclude_seen,
                exclude=req.exclude,
                deadline=deadline,
                times=[c[0] for c in clocks] if timed else None,
                at=[c[1] for c in clocks] if timed else None,
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
