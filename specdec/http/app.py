"""The OpenAI-compatible HTTP front door: a Starlette app that is a client of `specdec.v1.SpecDec`.

It adds no logic of its own to a round: each request becomes one `Generate` call, whose messages
become the reply (or its server-sent events). A client that disconnects cancels that call, which
frees the session on every service. Errors take OpenAI's JSON shape with the status a client
library maps correctly (`specdec.http.errors`); a client's mistake is never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import metrics
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.http import tool_calls
from specdec.http.background import BackgroundResponses
from specdec.http.errors import BadRequest, error_body, rpc_error, rpc_param
from specdec.http.flags import HttpConfig
from specdec.http.batch import PromptBatch, parallel_for
from specdec.http.best_of import BestOf
from specdec.http.calls import ClientGone, StoppableCall, run
from specdec.http.guard import Guard
from specdec.http.infill import InfillError, infill_prompt
from specdec.http.response_store import (ResponseNotFound, ResponseNotReady, ResponseStore, StoreUnavailable,
                                         response_store)
from specdec.http.responses import Echo, Reply, TokenText
from specdec.http.responses_routes import cancel_response, create_response, input_items, stored_response
from specdec.http.schema import ChatCompletionRequest, CompletionRequest
from specdec.http.validation import parse
from specdec.http.tokens_api import detokenize, tokenize
from specdec.runtime import security
from specdec.runtime.server import CHANNEL_OPTIONS

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 1.0


class Gateway:
    """What the routes share: the channel to the orchestrator, the model's name and tokenizer."""

    def __init__(self, config: HttpConfig):
        self.config = config
        self.security = security.current()
        self.channel: grpc.aio.Channel | None = None
        self.info = pb.ModelInfo()
        self.model = config.model_name
        self.tokenizer = None
        self.tokens: TokenText | None = None
        self.stopping = threading.Event()  # the server stopped waiting for its calls: each ends at its next message
        self.stored = response_store(config)
        self.background = BackgroundResponses(self.stored)
        meter = metrics.get_meter("specdec.http")
        self.requests = meter.create_counter("http_requests", description="HTTP requests by route and status")
        self.latency = meter.create_histogram("http_request_duration", unit="s",
                                              description="Time to the response's last byte, by route")
        meter.create_observable_gauge("http_background_responses", [self._observe_background],
                                      description="Background responses this server is generating")
        if isinstance(self.stored, ResponseStore):  # Redis reports its own memory
            meter.create_observable_gauge("http_stored_responses", [self._observe_store],
                                          description="Responses API responses stored in this server's memory")
            meter.create_observable_gauge("http_stored_response_bytes", [self._observe_store_bytes], unit="By",
                                          description="Their size, against --response-store-mb")

    def _observe_background(self, options):
        yield metrics.Observation(len(self.background))

    def _observe_store(self, options):
        yield metrics.Observation(len(self.stored))

    def _observe_store_bytes(self, options):
        yield metrics.Observation(self.stored.bytes)

    async def start(self) -> None:
        """Connect, and learn the model's name, context and tokenizer from the orchestrator."""
        from specdec import weights
        from specdec.weights.sources import load_tokenizer

        self.channel = self.security.aio_channel(self.config.endpoint, CHANNEL_OPTIONS)
        self.stub = pb_grpc.SpecDecStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.info = await self.stub.Info(pb.ModelInfoRequest(), timeout=60, metadata=self.metadata)
        self.model = self.model or served_name(self.info.model)
        spec = self.config.tokenizer or self.info.model
        self.tokenizer = await asyncio.to_thread(lambda: load_tokenizer(weights.resolve(spec)))
        self.tokens = TokenText(self.tokenizer)
        log.info("OpenAI API for %s in front of %s", self.model, self.config.endpoint)

    async def stop(self) -> None:
        await self.background.close()
        if self.channel is not None:
            await self.channel.close()

    @property
    def metadata(self) -> tuple:
        return self.security.call_metadata()

    def model_card(self) -> dict:
        return {"id": self.model, "object": "model", "created": 0, "owned_by": "specdec",
                "max_model_len": self.info.max_context}

    def check_model(self, model: str) -> None:
        if model != self.model:
            raise ModelNotFound(f"the model {model!r} does not exist; this server serves {self.model!r}")

    def chat_prompt(self, request: ChatCompletionRequest) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest(f"the model {self.model!r} has no chat template: use /v1/completions", "messages")
        messages = [m.for_template() for m in request.messages]
        tools = request.offered_tools()
        if tools:
            try:
                tool_calls.check_template(str(self.tokenizer.chat_template))
            except tool_calls.ToolError as exc:
                raise BadRequest(str(exc), "tools") from None
        shown = {"tools": [tool.spec for tool in tools.values()]} if tools else {}
        try:
            ids = self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **shown,
                                                     **request.template_arguments())
        except Exception as exc:  # noqa: BLE001 - a template rejects what it cannot render (jinja raises)
            raise BadRequest(f"the chat template cannot render these messages: {exc}", "messages") from None
        return list(ids)

    def generate(self, requests: list[pb.GenerateRequest], n: int = 1):
        """The Generate call of one prompt's request, or several prompts' read as one call (`PromptBatch`)."""
        def start(one: pb.GenerateRequest):
            return self.stub.Generate(one, timeout=self.config.request_timeout_s, metadata=self.metadata)

        if len(requests) == 1:
            return StoppableCall(start(requests[0]), self.stopping)
        return StoppableCall(PromptBatch(start, requests, n, parallel_for(self.info.max_sessions, n)), self.stopping)

    def chat_request(self, body: ChatCompletionRequest, prompt: list[int],
                     length_field: str = "") -> pb.GenerateRequest:
        """The generation a chat body asks for, its reply at most as long as the room left in the context.
        `length_field`: what the client called the reply's length (default: the chat API's field it set)."""
        room = max(self.info.max_context - len(prompt), 1)
        self.check_length(body.max_new_tokens(), length_field or body.length_field())
        max_tokens = body.max_new_tokens() or min(self.info.max_new_tokens or room, room)
        return body.generate_request(max_tokens, body.top(), prompt_token_ids=prompt)

    def check_length(self, requested: int | None, field: str) -> None:
        """A reply's length past the orchestrator's limit is a 400 naming the client's field (as OpenAI answers
        a `max_tokens` past a model's), not the orchestrator's message about its own field."""
        limit = self.info.max_new_tokens
        if requested and limit and requested > limit:
            raise BadRequest(f"{field} is too large: {requested}; this server generates at most {limit} tokens a "
                             "reply", field)


class ModelNotFound(Exception):
    pass


def served_name(spec: str) -> str:
    """The id a model spec is served under: the packaged model's name, or a path's file or folder name."""
    from specdec.weights import PACKAGED_PREFIX
    from specdec.weights.packaged import BUNDLE_DIR, PACKAGED
    from specdec.weights.sources import BUILT_IN

    if spec.startswith(PACKAGED_PREFIX):
        packaged = PACKAGED.get(spec.removeprefix(PACKAGED_PREFIX))
        return packaged.name if packaged else spec
    if spec.startswith(BUILT_IN):
        return spec
    parts = spec.rstrip("/").rsplit("/", 2)
    if len(parts) == 3 and parts[-1] == BUNDLE_DIR:  # a packaged model's folder: <cache>/<name>/bundle
        return parts[-2]
    return parts[-1].removesuffix(".gguf")


# -- routes --------------------------------------------------------------------------
async def models(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    return JSONResponse({"object": "list", "data": [gateway.model_card()]})


async def model(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    gateway.check_model(request.path_params["model"])
    return JSONResponse(gateway.model_card())


async def completions(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    body = parse(CompletionRequest, await request.body())
    gateway.check_model(body.model)
    prompts = body.prompts()
    if body.suffix:
        if len(prompts) > 1 or "prompt" not in prompts[0]:
            raise BadRequest("suffix needs the prompt as one string", "suffix")
        try:
            prompts = [{"prompt_token_ids": infill_prompt(gateway.tokenizer, prompts[0]["prompt"], body.suffix)}]
        except InfillError as exc:
            raise BadRequest(str(exc), "suffix") from None
    echo = None
    if body.echo:
        texts = tuple(p["prompt"] if "prompt" in p else gateway.tokenizer.decode(p["prompt_token_ids"]) for p in prompts)
        echo = Echo(texts, drop_output=body.scores_only())
    gateway.check_length(body.max_tokens, "max_tokens")
    best = BestOf(body.n, body.best_of, body.logprobs is not None) if body.ranked() else None
    return await run(request, gateway, body, [body.completion_request(**prompt) for prompt in prompts],
                     Reply("completion", gateway.model, gateway.tokens, body.reported_logprobs(), echo=echo,
                           n=body.generated(), best=best, prompt_top=body.prompt_logprobs))


async def chat_completions(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    body = parse(ChatCompletionRequest, await request.body())
    gateway.check_model(body.model)
    generate = gateway.chat_request(body, gateway.chat_prompt(body))
    echoed = body.echoed()
    return await run(request, gateway, body, [generate], Reply("chat", gateway.model, gateway.tokens, body.top(),
                                                             body.offered_tools(), n=body.n,
                                                             echo=Echo((echoed,)) if echoed else None,
                                                             prompt_top=body.prompt_logprobs))


async def health(request: Request) -> Response:
    """200 while the orchestrator reports SERVING (within a second), 503 otherwise; `orchestrator` says
    what it answered (a health status), or the gRPC code of its failure to answer."""
    gateway: Gateway = request.app.state.gateway
    try:
        reply = await gateway.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_TIMEOUT_S)
        answer = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.RpcError as exc:
        answer = exc.code().name
    serving = answer == "SERVING"
    return JSONResponse({"status": "ok" if serving else "unavailable", "orchestrator": answer},
                        200 if serving else 503)


async def prometheus(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return Response(await asyncio.to_thread(generate_latest, REGISTRY), media_type=CONTENT_TYPE_LATEST)


def with_errors(route):
    """Route exceptions -> OpenAI error responses."""
    async def handle(request: Request) -> Response:
        try:
            return await route(request)
        except BadRequest as exc:
            return error_body(400, "invalid_request_error", str(exc), exc.param)
        except ModelNotFound as exc:
            return error_body(404, "not_found_error", str(exc), "model")
        except StoreUnavailable as exc:
            return error_body(503, "service_unavailable", f"the response store cannot be reached: {exc}")
        except ResponseNotFound as exc:
            return error_body(404, "not_found_error", f"no stored response has the id {exc.args[0]!r}",
                              "response_id" if "response_id" in request.path_params else "previous_response_id")
        except ResponseNotReady as exc:
            return error_body(400, "invalid_request_error", f"response {exc.args[0]!r} is {exc.args[1]}: a "
                              "conversation goes on from a completed or incomplete response", "previous_response_id")
        except grpc.RpcError as exc:
            return error_body(*rpc_error(exc), rpc_param(exc))
        except ClientGone:
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001 - a bug: the client gets a 500 in OpenAI's shape, we get the trace
            log.exception("internal error on %s", request.url.path)
            return error_body(500, "internal_error", f"internal error: {exc!r}")
    return handle


ROUTES = {"/v1/models": (models, ["GET"]), "/v1/models/{model:path}": (model, ["GET"]), "/v1/completions": (completions, ["POST"]),
          "/v1/chat/completions": (chat_completions, ["POST"]), "/v1/responses": (create_response, ["POST"]),
          "/v1/responses/{response_id}": (stored_response, ["GET", "DELETE"]),
          "/v1/responses/{response_id}/input_items": (input_items, ["GET"]),
          "/v1/responses/{response_id}/cancel": (cancel_response, ["POST"]),
          "/tokenize": (tokenize, ["POST"]), "/detokenize": (detokenize, ["POST"]),
          "/health": (health, ["GET"]), "/metrics": (prometheus, ["GET"])}


def create_app(config: HttpConfig) -> Starlette:
    gateway = Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await gateway.start()
        yield
        await gateway.stop()

    async def no_route(request: Request, exc: HTTPException) -> Response:
        return error_body(exc.status_code, "invalid_request_error" if exc.status_code < 500 else "internal_error",
                          f"{request.method} {request.url.path}: {exc.detail}")

    app = Starlette(routes=[Route(path, with_errors(fn), methods=methods) for path, (fn, methods) in ROUTES.items()],
                    lifespan=lifespan, exception_handlers={HTTPException: no_route})
    app.state.gateway = gateway
    app.add_middleware(Guard, gateway=gateway, routes=frozenset(ROUTES))
    return app
