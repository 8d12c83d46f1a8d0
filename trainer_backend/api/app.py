"""The HTTP layer: FastAPI routes mirroring the Tinker API one to one.

Routes are thin: authenticate, parse, call one method of `TrainingService`, return a model. Typed errors become
status codes in one handler, always with a JSON body naming the problem (the SDK treats an empty 400 as a proxy
failure and retries it). `retrieve_future` long-polls: it holds the request until the future finishes or
`long_poll_s` passes, because the SDK re-polls a `try_again` at once, with no pause.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, TypeVar

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from google.protobuf.message import DecodeError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from tinker.proto import tinker_public_pb2 as pb

from trainer_backend.api.body_limit import BodyLimit
from trainer_backend.api.caller import FutureWaiters, IdempotencyKey, Owner, parse
from trainer_backend.api.metrics import ServiceCollector
from trainer_backend.api.openai_routes import add_openai_routes
from trainer_backend.auth import KeyPolicy
from trainer_backend.errors import BackendError
from trainer_backend.ledger import FutureState, ResultFormat
from trainer_backend.openai_service import OpenAIInference
from trainer_backend.service import Submitted, TrainingService
from trainer_backend.wire import schemas
from trainer_backend.wire.proto import PROTOBUF_CONTENT_TYPE, WireFormatError, decode_forward_backward_request
from validation_errors import describe_validation_error

log = logging.getLogger(__name__)
# The most training runs one page of the listing holds.
MAX_PAGE = 1000


def _sequence_of(raw: bytes, content_encoding: str | None) -> tuple[str | None, int | None]:
    """The model and seq_id of a forward_backward body the decoder refused, where its envelope still parses.

    An SDK client refused for its data (a negative token id, an image chunk) has used up that seq_id all the same.
    Compressed bodies are not read: the SDK compresses only when the client config asks, and this server's does not.
    """
    if content_encoding:
        return None, None
    try:
        message = pb.ForwardBackwardRequest.FromString(raw)
    except DecodeError:
        return None, None
    return message.model_id or None, message.seq_id or None


def future_response(submitted: Submitted) -> dict:
    return schemas.UntypedAPIFuture(
        request_id=submitted.record.request_id,
        model_id=submitted.model_id,
        sample_sequence_ids=submitted.sample_sequence_ids,
    ).model_dump(mode="json", exclude_none=True)


Body = TypeVar("Body", bound=BaseModel)


async def queue_request(
    request: Request,
    who: str,
    key: str | None,
    schema: type[Body],
    submit: Callable[[str, Body, bytes, str | None], Submitted],
) -> dict:
    """A queued call's route: parse the body as `schema`, hand it to `submit` with the raw bytes (which the
    idempotency check hashes) and answer with its future."""
    raw = await request.body()
    return future_response(submit(who, parse(schema, raw), raw, key))


def error_response(request: Request, message: str, category: str, status_code: int) -> JSONResponse:
    """Every refusal's JSON: `{"error": message, "category": …}` on the Tinker routes, OpenAI's
    `{"error": {"message", "type", "code"}}` (with the category beside it) on /v1/, where OpenAI clients read it."""
    if request.url.path.startswith("/v1/"):
        kind = "server_error" if category == "server" else "invalid_request_error"
        return JSONResponse(
            {"error": {"message": message, "type": kind, "code": status_code}, "category": category},
            status_code=status_code,
        )
    return JSONResponse({"error": message, "category": category}, status_code=status_code)


def create_app(service: TrainingService, policy: KeyPolicy, long_poll_s: float = 25.0) -> FastAPI:
    """The ASGI app for one service; the caller owns the service's lifetime."""
    waiters = FutureWaiters()
    service.ledger.add_listener(waiters.notify)
    registry = CollectorRegistry()
    registry.register(ServiceCollector(service))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        waiters.bind(asyncio.get_running_loop())
        yield

    app = FastAPI(title="trainer_backend", summary="A Tinker-compatible LoRA training server", lifespan=lifespan)

    @app.exception_handler(BackendError)
    async def backend_error(request: Request, error: BackendError) -> JSONResponse:
        return error_response(request, str(error), error.category, error.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid_parameters(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = describe_validation_error(error, root="request")
        return error_response(request, f"invalid request: {problems}", "user", 400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        # Unknown routes and methods: the same JSON shape as every other error.
        return error_response(request, str(error.detail), "user", error.status_code)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, _: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        # The exception's text stays in the log: it may name server paths.
        return error_response(request, "internal error; the server's log has the details", "server", 500)

    add_openai_routes(app, service, OpenAIInference(service, service.config.chat_template), waiters, long_poll_s)
    app.state.policy = policy
    app.add_middleware(BodyLimit, max_bytes=service.config.max_request_bytes)
    api = "/api/v1"

    # --- start-up, sessions, health ---------------------------------------------------------------------

    @app.post(f"{api}/client/config")
    async def client_config(request: Request) -> dict:
        parse(schemas.ClientConfigRequest, await request.body())
        # Plain httpx transport: the SDK's default (pyqwest) adds nothing on loopback.
        return {"use_pyqwest_transport": False}

    @app.post(f"{api}/create_session")
    async def create_session(request: Request, who: Owner) -> dict:
        body = parse(schemas.CreateSessionRequest, await request.body())
        return {"session_id": service.create_session(who, body)}

    @app.post(f"{api}/session_heartbeat")
    async def session_heartbeat(request: Request, who: Owner) -> dict:
        service.heartbeat(who, parse(schemas.SessionHeartbeatRequest, await request.body()).session_id)
        return {}

    @app.post(f"{api}/sessions/{{session_id}}/finish")
    async def finish_session(session_id: str, request: Request, who: Owner) -> dict:
        parse(schemas.FinishSessionRequest, await request.body())
        service.finish_session(who, session_id)
        return {}

    @app.post(f"{api}/telemetry")
    async def telemetry(who: Owner) -> dict:
        return {"status": "accepted"}

    @app.get("/healthz")
    @app.get(f"{api}/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get(f"{api}/get_server_capabilities")
    async def capabilities(who: Owner) -> dict:
        return service.views.capabilities().model_dump(mode="json")

    @app.get(f"{api}/status")
    async def status(who: Owner) -> dict:
        return service.status(who).model_dump(mode="json")

    # Not async: a scrape reads the ledger and checkpoint metadata from disk, which runs on a worker thread instead
    # of holding up the event loop.
    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # --- training ---------------------------------------------------------------------------------------

    @app.post(f"{api}/create_model")
    async def create_model(request: Request, who: Owner, key: IdempotencyKey = None) -> dict:
        return await queue_request(request, who, key, schemas.CreateModelRequest, service.create_model)

    @app.post(f"{api}/get_info")
    async def get_info(request: Request, who: Owner) -> dict:
        body = parse(schemas.GetInfoRequest, await request.body())
        return service.get_info(who, body.model_id).model_dump(mode="json", exclude_none=True)

    @app.post(f"{api}/forward_backward")
    async def forward_backward(
        request: Request,
        who: Owner,
        key: IdempotencyKey = None,
        content_encoding: Annotated[str | None, Header()] = None,
    ) -> dict:
        raw = await request.body()
        try:
            # Off the event loop: inflating and parsing a large body would stall every other request.
            batch = await asyncio.to_thread(
                decode_forward_backward_request,
                raw,
                content_encoding,
                max_decompressed_bytes=service.config.max_request_bytes,
                max_tensor_elements=service.config.max_tensor_elements,
            )
        except WireFormatError:
            service.release_seq_id(who, *_sequence_of(raw, content_encoding))
            raise
        return future_response(service.forward_backward(who, batch, raw, key))

    @app.post(f"{api}/optim_step")
    async def optim_step(request: Request, who: Owner, key: IdempotencyKey = None) -> dict:
        return await queue_request(request, who, key, schemas.OptimStepRequest, service.optim_step)

    @app.post(f"{api}/save_weights")
    async def save_weights(request: Request, who: Owner, key: IdempotencyKey = None) -> dict:
        return await queue_request(request, who, key, schemas.SaveWeightsRequest, service.save_weights)

    @app.post(f"{api}/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request, who: Owner, key: IdempotencyKey = None) -> dict:
        return await queue_request(
            request, who, key, schemas.SaveWeightsForSamplerRequest, service.save_weights_for_sampler
        )

    @app.post(f"{api}/load_weights")
    async def load_weights(request: Request, who: Owner, key: IdempotencyKey = None) -> dict:
        return await queue_request(request, who, key, schemas.LoadWeightsRequest, service.load_weights)

    # --- sampling ---------------------------------------------------------------------------------------

    @app.post(f"{api}/create_sampling_session")
    async def create_sampling_session(request: Request, who: Owner) -> dict:
        body = parse(schemas.CreateSamplingSessionRequest, await request.body())
        return {"sampling_session_id": service.create_sampling_session(who, body)}

    @app.get(f"{api}/samplers/{{sampler_id}}")
    async def sampler(sampler_id: str, who: Owner) -> dict:
        return service.get_sampler(who, sampler_id).model_dump(mode="json", exclude_none=True)

    @app.post(f"{api}/asample")
    async def asample(request: Request, who: Owner, key: IdempotencyKey = None) -> dict:
        return await queue_request(request, who, key, schemas.SampleRequest, service.sample)

    # --- futures ----------------------------------------------------------------------------------------

    @app.post(f"{api}/retrieve_future")
    async def retrieve_future(request: Request, who: Owner) -> Response:
        body = parse(schemas.FutureRetrieveRequest, await request.body())
        record = await waiters.wait(service, who, body.request_id, long_poll_s)
        if record.state is FutureState.DONE:
            media = PROTOBUF_CONTENT_TYPE if record.result_format is ResultFormat.PROTO else "application/json"
            return Response(record.result, media_type=media)
        if record.state is FutureState.FAILED:
            return JSONResponse({"error": record.error, "category": record.category or "unknown"})
        return JSONResponse({"type": "try_again", "request_id": record.request_id, "queue_state": "active"})

    # --- REST: runs and checkpoints ---------------------------------------------------------------------

    @app.get(f"{api}/training_runs")
    async def training_runs(
        who: Owner,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
        offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    ) -> dict:
        return service.views.list_training_runs(who, limit, offset).model_dump(mode="json")

    @app.get(f"{api}/training_runs/{{model_id}}")
    async def training_run(model_id: str, who: Owner) -> dict:
        return service.views.training_run(who, model_id).model_dump(mode="json")

    @app.get(f"{api}/training_runs/{{model_id}}/checkpoints")
    async def run_checkpoints(model_id: str, who: Owner) -> dict:
        return service.views.list_checkpoints(who, model_id).model_dump(mode="json")

    @app.delete(f"{api}/training_runs/{{model_id}}/checkpoints/{{checkpoint_id:path}}")
    async def delete_checkpoint(model_id: str, checkpoint_id: str, who: Owner) -> dict:
        service.views.delete_checkpoint(who, model_id, checkpoint_id)
        return {}

    @app.get(f"{api}/checkpoints")
    async def checkpoints(who: Owner) -> dict:
        return service.views.list_checkpoints(who, None).model_dump(mode="json")

    @app.post(f"{api}/weights_info")
    async def weights_info(request: Request, who: Owner) -> dict:
        body = parse(schemas.WeightsInfoRequest, await request.body())
        return service.views.weights_info(who, body.tinker_path).model_dump(mode="json", exclude_none=True)

    return app
