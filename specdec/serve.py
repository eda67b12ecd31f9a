"""An OpenAI-compatible HTTP server on the scheduler (`specdec serve`).

Each request is a `streaming.stream` on the model's one scheduler, iterated on its own thread so that the
event loop never waits on the model. What specdec does not do (n > 1, logprobs, tools, ...) is refused by
name, every bad value is a 400 in OpenAI's error shape naming the field, and each response carries
`speculation` stats.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import uuid
from functools import partial
from typing import AsyncIterator, Literal

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException

from .metrics import Metrics, RequestMetrics
from .failure import RequestFailed
from .streaming import Delta, Stream, stream

CHAT_DEFAULT_TOKENS = 4096  # a chat request's default max_tokens where the model's context is unknown
# OpenAI fields specdec does not implement: refused unless they ask for nothing (the values listed).
REFUSED = {"n": (1,), "best_of": (1,), "logprobs": (False,), "top_logprobs": (0,), "echo": (False,),
           "suffix": ("",), "logit_bias": ({},), "tools": ([],), "functions": ([],), "tool_choice": ("none",),
           "function_call": ("none",), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
           "response_format": ({"type": "text"},)}
_TYPE_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\])$")  # pydantic's name for a union's member
_END = object()


class ApiError(Exception):
    """A refused request as OpenAI words it: a message, the field at fault, a code, the HTTP status."""

    def __init__(self, message: str, param: str | None = None, code: str | None = "invalid_value",
                 status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def response(self) -> JSONResponse:
        body = {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


class _Body(BaseModel):
    """The fields both endpoints share; strict, so that a wrong type is a 400, not a guess."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")  # extras: checked against REFUSED
    model: str
    temperature: float | None = None  # OpenAI's default: 1
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extra (-1 or 0: off), as is min_p
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    stream: bool | None = False
    stream_options: dict[str, bool] | None = None


class CompletionBody(_Body):
    prompt: str | list[str] | list[int] | list[list[int]]


class _TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]
    text: str


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_TextPart] | None = None


class ChatBody(_Body):
    messages: list[_Message]
    max_completion_tokens: int | None = None


async def _deltas(s: Stream, life: RequestMetrics) -> AsyncIterator[Delta]:
    """The stream's deltas on the event loop; a thread iterates it (each `next` waits for a round)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def pump() -> None:
        last: object = _END
        try:
            for d in s:
                life.on_round(d.event)
                loop.call_soon_threadsafe(queue.put_nowait, d)
        except Exception as e:  # noqa: BLE001 (RequestFailed, or a closed loop: the client gets it if still there)
            last = e
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server is stopping
            loop.call_soon_threadsafe(queue.put_nowait, last)

    threading.Thread(target=pump, name="specdec-serve-request", daemon=True).start()
    try:
        while (item := await queue.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        s.cancel()  # a client gone mid-stream frees its batch slot (nothing once the request has ended)


class _EventStream(StreamingResponse):
    """Server-sent events whose request is cancelled, and counted, however the response ends (a hang-up too)."""

    def __init__(self, chunks: AsyncIterator[str], s: Stream, life: RequestMetrics) -> None:
        super().__init__(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.s, self.life = s, life

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.s.cancel()
            self.life.end()


async def _events(s: Stream, life: RequestMetrics, head: dict, chat: bool, usage: bool) -> AsyncIterator[str]:
    """The chunks of a streamed response, as OpenAI sends them, then `[DONE]`."""
    head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
    extra = {"usage": None} if usage else {}  # with include_usage, every chunk has the field

    def chunk(piece: dict, finish: str | None = None, **more) -> str:
        return _sse({**head, "choices": [{"index": 0, **piece, "logprobs": None, "finish_reason": finish}],
                     **extra, **more})

    try:
        if chat:
            yield chunk({"delta": {"role": "assistant", "content": ""}})
        async for d in _deltas(s, life):
            if d.text:
                yield chunk({"delta": {"content": d.text}} if chat else {"text": d.text})
        spec = _speculation(s)
        yield chunk({"delta": {}} if chat else {"text": ""}, s.finish_reason, speculation=spec)
        if usage:
            yield _sse({**head, "choices": [], "usage": _usage(s), "speculation": spec})
        life.outcome = "ok"
    except RequestFailed as e:  # the status has gone out already, so the error is an event
        life.outcome = "error"
        yield _sse({"error": {"message": str(e), "type": "server_error", "param": None, "code": e.failure.cause}})
    yield "data: [DONE]\n\n"


async def _respond(request: Request, s: Stream, life: RequestMetrics, head: dict, chat: bool) -> Response:
    """The whole response as one JSON body; a client that hangs up first cancels its request."""
    async def collect() -> str:
        text = "".join([d.text async for d in _deltas(s, life)])
        life.outcome = "ok"
        return text

    async def disconnected() -> None:  # the body has been read: a disconnect is all that is left to receive
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # the client hung up: end its request and answer no one
            task.cancel()
            s.cancel()
            return Response(status_code=499)
        text = task.result()
    except RequestFailed as e:
        life.outcome = "error"
        raise ApiError(str(e), None, e.failure.cause, 500, "server_error") from None
    finally:
        gone.cancel()
        life.end()
    choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    choice = {"index": 0, **choice, "logprobs": None, "finish_reason": s.finish_reason}
    return JSONResponse({**head, "choices": [choice], "usage": _usage(s), "speculation": _speculation(s)})


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _usage(s: Stream) -> dict:
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "total_tokens": s.prompt_tokens + s.completion_tokens}


def _speculation(s: Stream) -> dict:
    st = s.stats
    return {key: st[key] for key in ("mean_accepted_length", "target_forwards", "new_tokens")}


def _check_fields(body: _Body) -> None:
    """Refuse, by name, each field that asks for what specdec does not do."""
    for name, fine in REFUSED.items():
        value = (body.model_extra or {}).get(name)
        if value is not None and not any(type(value) is type(f) and value == f for f in fine):
            raise ApiError(f"`{name}` = {value!r} is not supported by specdec (allowed: {fine[0]!r} or omit it)",
                           name, "unsupported_parameter")
    if body.seed is not None and body.seed >= 2**63:  # a torch.Generator's seed is 64 bits
        raise ApiError(f"`seed` must be below 2**63, got {body.seed}", "seed")


def _prompt(prompt) -> dict:
    """The completions `prompt` as stream()'s `prompt` or `prompt_ids`: one text or one list of ids."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(f"`prompt` holds {len(prompt)} prompts; specdec takes one per request "
                           "(send them as concurrent requests: they are batched together)", "prompt")
        prompt = prompt[0]
    return {"prompt_ids": prompt} if isinstance(prompt, list) else {"prompt": prompt}


def _chat_ids(tokenizer, messages: list[_Message]) -> list[int]:
    """The conversation through the model's chat template, ready for the assistant's turn."""
    if not messages:
        raise ApiError("`messages` is empty: give at least one message", "messages")
    turns = [{"role": "system" if m.role == "developer" else m.role,
              "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content or ())}
             for m in messages]
    try:
        out = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=True)
    except Exception as e:  # noqa: BLE001 (a template may raise anything on a conversation it refuses)
        raise ApiError(f"the chat template refused `messages`: {e}", "messages") from None
    return list(out["input_ids"])


def build_server(loaded, *, metrics: Metrics | None = None, ui=None) -> FastAPI:
    """The OpenAI-compatible app over one model; its scheduler starts here with `metrics` unless it runs.

    Args:
        loaded: a `specdec.Loaded` or an `engine_process.RemoteModel`.
        metrics: fed by every request and served at `/metrics` (None: a registry of its own).
        ui: a Gradio Blocks to mount at `/` (None: the API alone).
    """
    from .engine_process import RemoteModel

    metrics = Metrics() if metrics is None else metrics
    if not loaded.serving:
        loaded.serve(metrics=metrics)
    engine, name, created = loaded.engine, loaded.name or "specdec", int(time.time())
    context = engine.info()["context"]
    cache_state = engine.prefix_cache_state if isinstance(loaded, RemoteModel) else (
        lambda: engine.info()["prefix_cache"])
    app = FastAPI(title="specdec", summary="OpenAI-compatible speculative decoding")
    app.add_exception_handler(ApiError, _refused)
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.add_exception_handler(HTTPException, _http_error)

    async def run(request: Request, body: _Body, chat: bool, max_tokens: int, rename: dict, **prompt) -> Response:
        """Check the values, submit the request (off the loop: tokenizing and submitting may wait) and answer."""
        top_k = 0 if body.top_k == -1 else body.top_k
        kwargs = dict(max_new_tokens=max_tokens, temperature=1.0 if body.temperature is None else body.temperature,
                      top_p=1.0 if body.top_p is None else body.top_p, top_k=top_k or 0, min_p=body.min_p or 0.0,
                      seed=body.seed, stop=body.stop, events=True, **prompt)
        try:
            s = await anyio.to_thread.run_sync(partial(stream, loaded, **kwargs))
        except ValueError as e:  # specdec names its parameter in backticks: name the API's field instead
            message, found = str(e), re.search(r"`(\w+)`", str(e))
            for ours, theirs in rename.items():
                message = message.replace(f"`{ours}`", f"`{theirs}`")
            raise ApiError(message, rename.get(found[1], found[1]) if found else None) from None
        except RuntimeError as e:  # the scheduler is closed, or the engine's process has ended
            raise ApiError(str(e), None, "unavailable", 503, "server_error") from None
        life = RequestMetrics(metrics, cache_state=cache_state).begin()
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion" if chat else "text_completion", "created": int(time.time()), "model": name}
        if body.stream:
            usage = bool((body.stream_options or {}).get("include_usage"))
            return _EventStream(_events(s, life, head, chat, usage), s, life)
        return await _respond(request, s, life, head, chat)

    def check(body: _Body) -> None:
        if body.model != name:
            raise ApiError(f"The model `{body.model}` does not exist: this server serves `{name}`", "model",
                           "model_not_found", 404)
        _check_fields(body)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Response:
        check(body)
        max_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's default
        rename = {"max_new_tokens": "max_tokens", "prompt_ids": "prompt"}
        return await run(request, body, False, max_tokens, rename, **_prompt(body.prompt))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request) -> Response:
        check(body)
        if not loaded.has_chat_template:
            raise ApiError(f"the model `{name}` has no chat template, so it cannot take `messages`: "
                           "use /v1/completions with a prompt", "messages", "no_chat_template")
        ids = await anyio.to_thread.run_sync(_chat_ids, loaded.tokenizer, body.messages)
        field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        given = getattr(body, field)
        max_tokens = given if given is not None else (  # up to the context
            max(1, context - len(ids)) if context else CHAT_DEFAULT_TOKENS)
        rename = {"max_new_tokens": field, "prompt_ids": "messages", "prompt": "messages"}
        return await run(request, body, True, max_tokens, rename, prompt_ids=ids)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "specdec",
                                            "max_model_len": context}]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> Response:
        try:  # an engine process that has ended answers nothing: unhealthy
            stats = await anyio.to_thread.run_sync(loaded.scheduler.stats)
        except RuntimeError as e:
            return JSONResponse({"status": "error", "message": str(e)}, status_code=503)
        return JSONResponse({"status": "ok", "model": name, "scheduler": stats})

    if ui is not None:  # last: a mount at "/" shadows every route added after it
        import gradio as gr

        from .cli import demo_module

        app = gr.mount_gradio_app(app, ui, path="/", **demo_module().launch_kwargs())
    return app


async def _refused(_: Request, e: ApiError) -> JSONResponse:
    return e.response()


async def _http_error(_: Request, e: HTTPException) -> JSONResponse:
    return ApiError(str(e.detail), None, None, e.status_code).response()


async def _invalid_body(_: Request, e: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 (a body that is not JSON, a missing field, a wrong type) as OpenAI's 400 naming the field."""
    errors = e.errors()
    err, locs = errors[0], [[str(x) for x in f.get("loc", ()) if x != "body"] for f in errors]
    loc = locs[0]
    param, where = (loc[0] if loc else None), ".".join(loc)
    union = next((i for i, x in enumerate(loc) if _TYPE_TAG.match(x)), None)
    if err.get("type") == "json_invalid":
        error = ApiError(f"the body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}", None,
                         "invalid_json")
    elif not loc:
        error = ApiError("the body must be a JSON object (Content-Type: application/json)", None, "invalid_type")
    elif union is not None:  # every member of a union failed: name the field and the types it takes
        kinds = dict.fromkeys(x[union] for x in locs if x[:union] == loc[:union] and len(x) > union)
        error = ApiError(f"`{'.'.join(loc[:union])}` has the wrong type: it takes "
                         + " or ".join(kinds).replace("_TextPart", "text part"), param, "invalid_type")
    elif err.get("type") == "missing":
        error = ApiError(f"`{where}` is required", param, "missing_required_parameter")
    else:
        error = ApiError(f"`{where}`: {err['msg']}", param, "invalid_type")
    return error.response()
