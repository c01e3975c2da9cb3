"""A local OpenAI-compatible HTTP server for tests: scripted replies, recorded requests.

Tests talk to it with the real ``openai`` client (``base_url=server.base_url``), so the
SDK's request building, response parsing, retries and streaming are all exercised.
Each ``POST /v1/chat/completions`` takes the next item of the script::

    with ScriptedOpenAIServer([
        tool_calls(call("python_executor", {"code": "print(6 * 7)"}),
                   call("shell_executor", {"command": "ls"})),        # parallel calls
        error(429, "slow down"),                                       # the SDK retries
        lambda request: text(f"saw {len(request.tool_messages)} results"),  # computed reply
    ]) as server:
        client = OpenAI(base_url=server.base_url, api_key="test")
        ...
        server.chat_requests[1].messages   # what the model was sent

A script item is a :class:`Reply` or a callable taking the :class:`RecordedRequest` and
returning one.  When the script runs out the server answers 500 with a message saying so,
so a test fails loudly rather than hanging.  ``stream=True`` requests get the same reply
as server-sent events.  Tools sent with ``strict: true`` are checked against the rules of
strict mode and rejected with a 400, as the real API does.

``POST /v1/responses`` (the Responses API: the Agents SDK's default model, pydantic-ai's
``openai:`` models) takes the next item of the same script: a text reply becomes a
``message`` output item, each tool call a ``function_call`` item; streamed, the
``response.*`` events with the full response in ``response.completed``.  The results of
earlier calls are the request's ``function_call_output`` input items
(:attr:`RecordedRequest.function_outputs`); :meth:`RecordedRequest.tool_texts` reads
them from either API.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "RecordedRequest",
    "Reply",
    "ScriptedOpenAIServer",
    "call",
    "error",
    "image_urls",
    "strict_schema_problems",
    "text",
    "tool_calls",
]

_ids = itertools.count(1)


@dataclass
class Reply:
    """One scripted answer: an assistant message, or an error status with a body."""

    status: int = 200
    message: dict[str, Any] | None = None
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    #: Seconds to wait before answering (for client-timeout tests).
    delay: float = 0.0


Script = Reply | Callable[["RecordedRequest"], Reply]


def text(content: str, *, usage: dict[str, int] | None = None, delay: float = 0.0) -> Reply:
    """A plain assistant answer (``finish_reason="stop"``)."""
    return Reply(
        message={"role": "assistant", "content": content},
        finish_reason="stop",
        usage=usage,
        delay=delay,
    )


def call(name: str, arguments: dict[str, Any] | str, *, id: str | None = None) -> dict[str, Any]:
    """One tool call; a ``str`` is sent verbatim (e.g. invalid JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": id or f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def tool_calls(
    *calls: dict[str, Any], content: str | None = None, usage: dict[str, int] | None = None
) -> Reply:
    """An assistant message asking for one or more (parallel) tool calls."""
    return Reply(
        message={"role": "assistant", "content": content, "tool_calls": list(calls)},
        finish_reason="tool_calls",
        usage=usage,
    )


def error(
    status: int,
    message: str = "scripted error",
    *,
    type: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """An API error in OpenAI's shape; 429 and 5xx are retried by the SDK.

    ``retry-after-ms: 1`` is sent unless ``headers`` say otherwise, so retries are quick.
    """
    kind = type or ("rate_limit_error" if status == 429 else "server_error")
    return Reply(
        status=status,
        body={"error": {"message": message, "type": kind, "param": None, "code": code}},
        headers={"retry-after-ms": "1", **(headers or {})},
    )


@dataclass
class RecordedRequest:
    """A request the server received, with its JSON body parsed."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The ``messages`` of a chat request."""
        return list((self.body or {}).get("messages", []))

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The ``tools`` of a chat request."""
        return list((self.body or {}).get("tools") or [])

    @property
    def tool_messages(self) -> list[dict[str, Any]]:
        """Messages with ``role: tool`` (results of earlier calls)."""
        return [m for m in self.messages if m.get("role") == "tool"]

    def tool_results(self) -> list[dict[str, Any]]:
        """The JSON content of every tool message, parsed (text parts joined)."""
        out = []
        for message in self.tool_messages:
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
            out.append(json.loads(content))
        return out

    @property
    def input(self) -> list[dict[str, Any]]:
        """The ``input`` items of a Responses request (a bare string as one user message)."""
        items = (self.body or {}).get("input") or []
        return [{"role": "user", "content": items}] if isinstance(items, str) else list(items)

    @property
    def function_outputs(self) -> list[dict[str, Any]]:
        """The ``function_call_output`` items of a Responses request (earlier results)."""
        return [i for i in self.input if i.get("type") == "function_call_output"]

    def tool_texts(self) -> list[str]:
        """Every tool result the model was sent, as text (image parts dropped), from
        either API."""
        contents = [m.get("content") for m in self.tool_messages]
        contents += [i.get("output") for i in self.function_outputs]
        out = []
        for content in contents:
            if isinstance(content, list):
                content = "".join(
                    p.get("text", "") for p in content if p.get("type") in ("text", "input_text")
                )
            out.append(str(content))
        return out


# -- strict-mode checks -------------------------------------------------------------

_JSON_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    """The ``image_url`` parts of recorded chat messages, in order (what the model saw)."""
    return [
        part["image_url"]["url"]
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image_url"
    ]


def strict_schema_problems(schema: Any, path: str = "parameters") -> list[str]:
    """What violates OpenAI's strict mode in a function's parameter schema.

    Every object needs ``additionalProperties: false`` and every property in
    ``required``; defaults other than null are not allowed; types must be JSON types.
    """
    problems: list[str] = []
    if not isinstance(schema, dict):
        return [f"{path}: expected an object schema, got {schema!r}"]
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _JSON_TYPES:
            problems.append(f"{path}: unknown type {k!r}")
    if schema.get("default") is not None:
        problems.append(f"{path}: 'default' is not permitted in strict mode")
    if "object" in kinds or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            problems.append(f"{path}: 'additionalProperties' is required to be false")
        missing = [p for p in props if p not in (schema.get("required") or [])]
        if missing:
            problems.append(f"{path}: 'required' must include every property; missing {missing}")
        for name, sub in props.items():
            problems += strict_schema_problems(sub, f"{path}.properties.{name}")
    if isinstance(schema.get("items"), dict):
        problems += strict_schema_problems(schema["items"], f"{path}.items")
    for i, sub in enumerate(schema.get("anyOf") or []):
        problems += strict_schema_problems(sub, f"{path}.anyOf[{i}]")
    return problems


def _tool_problems(tools: list[Any]) -> list[str]:
    problems = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            problems.append(f"tools[{i}]: expected {{'type': 'function', 'function': {{...}}}}")
            continue
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            problems.append(f"tools[{i}].function.name: missing")
        if fn.get("strict"):
            problems += strict_schema_problems(
                fn.get("parameters"), f"tools[{i}].function.parameters"
            )
    return problems


def _response_tool_problems(tools: list[Any]) -> list[str]:
    """The Responses API's shape: ``{"type": "function", "name", "parameters", "strict"}``
    (other tool types, hosted or custom, are taken as they come)."""
    problems = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            problems.append(f"tools[{i}]: expected an object with a 'type'")
        elif tool["type"] == "function":
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                problems.append(f"tools[{i}].name: missing")
            if tool.get("strict"):
                problems += strict_schema_problems(tool.get("parameters"), f"tools[{i}].parameters")
    return problems


# -- the server ---------------------------------------------------------------------


class ScriptedOpenAIServer:
    """A threaded stdlib HTTP server on 127.0.0.1 answering from a script."""

    def __init__(
        self,
        script: Iterable[Script] = (),
        *,
        model: str = "scripted-model",
        check_strict_tools: bool = True,
    ) -> None:
        self.model = model
        self.check_strict_tools = check_strict_tools
        self.requests: list[RecordedRequest] = []
        self._script: list[Script] = list(script)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> ScriptedOpenAIServer:
        """Listen on a free port in a background thread."""
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="openai-stub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """What to pass as ``base_url`` (or ``OPENAI_BASE_URL``)."""
        assert self._httpd is not None, "start() the server first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    # -- script and records

    def add(self, *replies: Script) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        """Replies not yet used."""
        with self._lock:
            return len(self._script)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """Recorded ``/chat/completions`` requests, in order."""
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def responses_requests(self) -> list[RecordedRequest]:
        """Recorded ``/responses`` requests, in order."""
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/responses")]

    def _next(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            item = self._script.pop(0) if self._script else None
        if item is None:
            n = len(self.requests)
            return error(500, f"scripted server: no reply left for request #{n}")
        if not callable(item):
            return item
        try:
            return item(request)
        except Exception as exc:  # a broken script step must fail the test, not hang it
            return error(500, f"scripted server: reply function failed: {exc!r}")

    def completion(self, reply: Reply, model: str) -> dict[str, Any]:
        """The full ``chat.completion`` body for a reply."""
        message = dict(reply.message or {"role": "assistant", "content": ""})
        usage = reply.usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        return {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": reply.finish_reason or "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }

    def response(self, reply: Reply, model: str) -> dict[str, Any]:
        """The full Responses API ``response`` body for a reply."""
        message = reply.message or {"role": "assistant", "content": ""}
        output: list[dict[str, Any]] = []
        if message.get("content") or not message.get("tool_calls"):
            part = {"type": "output_text", "text": message.get("content") or "", "annotations": []}
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{next(_ids)}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [part],
                }
            )
        for tc in message.get("tool_calls") or []:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{next(_ids)}",
                    "call_id": tc["id"],
                    "name": tc["function"]["name"],
                    "arguments": tc["function"]["arguments"],
                    "status": "completed",
                }
            )
        chat = reply.usage or {}
        inp, out = chat.get("prompt_tokens", 10), chat.get("completion_tokens", 5)
        return {
            "id": f"resp_{next(_ids)}",
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": inp,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": inp + out,
            },
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_ref: ScriptedOpenAIServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            model = {"id": self.server_ref.model, "object": "model", "owned_by": "tests"}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            self._send_json(400, {"error": {"message": "body is not JSON"}})
            return
        request = RecordedRequest(
            "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
        )
        route = self.path.rstrip("/")
        responses = route.endswith("/responses")
        if not responses and not route.endswith("/chat/completions"):
            with self.server_ref._lock:
                self.server_ref.requests.append(request)
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if self.server_ref.check_strict_tools:
            check = _response_tool_problems if responses else _tool_problems
            problems = check(request.tools)
            if problems:
                with self.server_ref._lock:
                    self.server_ref.requests.append(request)
                message = "Invalid tools: " + "; ".join(problems)
                err = {"message": message, "type": "invalid_request_error", "code": None}
                self._send_json(400, {"error": err})
                return
        reply = self.server_ref._next(request)
        if reply.delay:
            time.sleep(reply.delay)
        if reply.status != 200:
            self._send_json(reply.status, reply.body or {}, reply.headers)
            return
        model = (body or {}).get("model") or self.server_ref.model
        if responses:
            response = reply.body or self.server_ref.response(reply, model)
            if (body or {}).get("stream"):
                self._send_events(_response_events(response))
            else:
                self._send_json(200, response, reply.headers)
            return
        completion = reply.body or self.server_ref.completion(reply, model)
        if (body or {}).get("stream"):
            self._stream(completion)
        else:
            self._send_json(200, completion, reply.headers)

    def _stream(self, completion: dict[str, Any]) -> None:
        """Send a completion as server-sent ``chat.completion.chunk`` events."""
        choice = completion["choices"][0]
        message = choice["message"]
        base = {k: completion[k] for k in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        content = message.get("content") or ""
        for start in range(0, len(content), 16):
            deltas.append({"content": content[start : start + 16]})
        for index, tc in enumerate(message.get("tool_calls") or []):
            deltas.append(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": tc["id"],
                            "type": "function",
                            "function": {"name": tc["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            deltas.append(
                {
                    "tool_calls": [
                        {"index": index, "function": {"arguments": tc["function"]["arguments"]}}
                    ]
                }
            )
        chunks = [
            {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
        ]
        chunks.append(
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            }
        )
        chunks.append({**base, "choices": [], "usage": completion.get("usage")})
        self._send_events(chunks, done=True)

    def _send_events(self, events: list[dict[str, Any]], *, done: bool = False) -> None:
        """Server-sent events: each a ``data:`` line (Responses events also named by
        ``event:``), then ``[DONE]`` for Chat Completions."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            name = f"event: {event['type']}\n" if "sequence_number" in event else ""
            self.wfile.write(f"{name}data: {json.dumps(event)}\n\n".encode())
        if done:
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def _response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses API response as its stream: ``response.created``, each output item
    added, its text or arguments in deltas, done, then ``response.completed``."""
    events: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    started = {**response, "status": "in_progress", "output": []}
    add("response.created", response=started)
    add("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            add("response.output_item.added", output_index=index, item={**item, "content": []})
            text = item["content"][0]["text"]
            empty = {"type": "output_text", "text": "", "annotations": []}
            add("response.content_part.added", **at, content_index=0, part=empty)
            for start in range(0, len(text), 16):
                piece = text[start : start + 16]
                add("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
            add("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            add("response.content_part.done", **at, content_index=0, part=item["content"][0])
        else:
            add("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            add("response.function_call_arguments.delta", **at, delta=item["arguments"])
            add("response.function_call_arguments.done", **at, arguments=item["arguments"])
        add("response.output_item.done", output_index=index, item=item)
    add("response.completed", response=response)
    return events
