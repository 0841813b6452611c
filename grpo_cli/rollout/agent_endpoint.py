"""The OpenAI-compatible endpoint env=agent serves on 127.0.0.1 while a rollout runs: the harness a
user already wrote (an OpenAI-SDK loop, a LangChain agent, a program) talks to it as to any
OpenAI server, and the policy answers.

This module is the HTTP side only: routes, sessions, the OpenAI request and response format. The
server's threads never tokenize or sample (a fast tokenizer is not safe to share between threads,
and the sampling loop is the rollout's): a request is queued with its session and waits; the
rollout's own thread takes the queue in batches (`rollout/agent_episodes.py`), samples, and answers.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, each also under a
per-episode base URL `/e/<session>/v1/...`; elsewhere the session is named by the `X-Session-Id`
header or the request's `user` field. `stream: true` gets the whole answer as one server-sent event
(it is sampled before it is sent; a client that streams still works). The standard library's
`ThreadingHTTPServer` (HTTP/1.0: one connection per request, so no keep-alive thread outlives a
rollout) starts in about a millisecond: a server per rollout costs nothing a step would notice.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from grpo_cli.rollout.chat_turns import TOOL_CALL, parse_tool_calls

ROUTE = re.compile(r"^(?:/e/(?P<session>[A-Za-z0-9_.-]+))?/v1/(?P<route>chat/completions|completions|models)/?$")
MAX_BODY_BYTES = 64 << 20  # a request body past this is refused (413): no conversation a policy reads is larger


@dataclass(eq=False)  # one request is equal to itself only (queue.remove)
class EndpointRequest:
    """One queued request: its session, route (`chat` or `completions`) and JSON body; the rollout
    thread answers it with a status and a JSON body."""

    session: str
    route: str
    body: dict[str, Any]
    arrived: float = field(default_factory=time.monotonic)
    status: int = 0  # 0 until answered
    reply: dict[str, Any] = field(default_factory=dict)
    _answered: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, status: int, reply: dict[str, Any]) -> bool:
        """The first answer is the one sent (the rollout's reply, or the handler's 504 at
        env.request_timeout_s): True when this one is."""
        with self._lock:
            if self._answered.is_set():
                return False
            self.status, self.reply = status, reply
            self._answered.set()
            return True


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error shape, which the openai package raises as APIStatusError with this message."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class AgentEndpoint:
    """The server, its open sessions and the queue the rollout thread serves (module docstring).
    Used as a context manager: it listens from `__enter__` to `__exit__`."""

    def __init__(self, model_name: str, request_timeout_s: float) -> None:
        self.model_name, self.request_timeout_s = model_name, request_timeout_s
        self.api_key = f"grpo-{secrets.token_hex(12)}"  # only the harnesses given it can sample
        self.changed = threading.Condition()  # a request arrived, or a harness ended: the rollout thread looks
        self.queue: list[EndpointRequest] = []
        self.open_sessions: set[str] = set()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.endpoint = self
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="grpo-agent-endpoint")

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def base_url(self, session: str) -> str:
        """The per-episode base URL a harness is given: every request under it is that episode's."""
        return f"http://127.0.0.1:{self.port}/e/{session}/v1"

    def __enter__(self) -> AgentEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        stopping = threading.Thread(target=self.server.shutdown, daemon=True)
        stopping.start()
        while stopping.is_alive():  # a connection wakes the server's select: no wait for its 0.5 s poll
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            stopping.join(0.005)
        self.server.server_close()
        with self.changed:
            left, self.queue, self.open_sessions = self.queue, [], set()
        for request in left:
            request.answer(503, error_body("the rollout ended", "server_error"))

    def open(self, session: str) -> None:
        with self.changed:
            self.open_sessions.add(session)

    def close_session(self, session: str, why: str) -> None:
        """The episode is over (its harness returned or ran out of time): its queued requests and
        any later one get an error saying why, never a sample."""
        with self.changed:
            self.open_sessions.discard(session)
            mine = [r for r in self.queue if r.session == session]
            self.queue = [r for r in self.queue if r.session != session]
        for request in mine:
            request.answer(409, error_body(f"episode {session} is over: {why}"))

    def notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def take(self) -> list[EndpointRequest]:
        """Every queued request, in arrival order, for the rollout thread to answer."""
        with self.changed:
            taken, self.queue = self.queue, []
        return taken

    def submit(self, request: EndpointRequest) -> EndpointRequest:
        """From a server thread: queue the request and wait for its answer, at most env.request_timeout_s."""
        with self.changed:
            if request.session not in self.open_sessions:
                request.answer(404, error_body(f"no open episode {request.session!r} (is the rollout over?)"))
                return request
            self.queue.append(request)
            self.changed.notify_all()
        if not request._answered.wait(self.request_timeout_s):
            with self.changed:
                if request in self.queue:  # not taken yet: the rollout will not sample it
                    self.queue.remove(request)
            timeout = f"no answer within env.request_timeout_s={self.request_timeout_s:g}s"
            request.answer(504, error_body(timeout, "timeout"))  # unless the rollout's answer came first
        return request


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler still waiting when the rollout ends does not hold the process
    request_queue_size = 4096  # every episode's harness may connect at once: the default backlog of 5 refuses some
    endpoint: AgentEndpoint  # what its requests reach


class _Handler(BaseHTTPRequestHandler):
    server: _Server  # the server whose endpoint this request reaches
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers after the rollout

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's name
        pass  # one line per request on stderr would bury the trainer's log

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        match = ROUTE.match(self.path.split("?")[0])
        if match is None or match["route"] != "models":
            self._send(404, error_body(f"no route GET {self.path}"))
        elif self._authorized():
            model = {"id": self.server.endpoint.model_name, "object": "model", "created": 0, "owned_by": "grpo"}
            self._send(200, {"object": "list", "data": [model]})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        match = ROUTE.match(self.path.split("?")[0])
        if match is None or match["route"] == "models":
            self._send(404, error_body(f"no route POST {self.path}"))
            return
        if not self._authorized():
            return
        body = self._body()
        if body is None:
            return
        session = match["session"] or self.headers.get("X-Session-Id") or body.get("user")
        if not session:
            why = "no session: use the base URL given to the agent (/e/<session>/v1), X-Session-Id or user"
            self._send(400, error_body(why))
            return
        route = "chat" if match["route"] == "chat/completions" else "completions"
        request = self.server.endpoint.submit(EndpointRequest(str(session), route, body))
        if body.get("stream") and request.status == 200:
            self._stream(request)
        else:
            self._send(request.status, request.reply)

    def _authorized(self) -> bool:
        if hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {self.server.endpoint.api_key}"):
            return True
        self._send(401, error_body("wrong API key: use the api_key given to the agent", "authentication_error"))
        return False

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(413, error_body(f"the request body is over {MAX_BODY_BYTES} bytes"))
            return None
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            self._send(400, error_body(f"the request body is not JSON: {err}"))
            return None
        if not isinstance(body, dict):
            self._send(400, error_body("the request body must be a JSON object"))
            return None
        return body

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, request: EndpointRequest) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in stream_chunks(request.reply):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


# ---- the OpenAI format ------------------------------------------------------------------------------


def content_text(content: Any) -> str:
    """A message's content as text: a string, None, or OpenAI's list of parts (their text joined)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def call_arguments(call: dict[str, Any]) -> Any:
    """A tool call's arguments as an object (OpenAI sends them as a JSON string)."""
    arguments = (call.get("function") or {}).get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A request's message as a chat template renders it: text content, and an assistant's tool
    calls written back in the `<tool_call>` form the model writes them in (the form they are parsed
    from, so a template without tool support still shows the model its own call)."""
    role, text = str(message.get("role", "user")), content_text(message.get("content"))
    calls = message.get("tool_calls") or []
    for call in calls:
        block = json.dumps({"name": (call.get("function") or {}).get("name"), "arguments": call_arguments(call)})
        text += f"<tool_call>\n{block}\n</tool_call>"
    out = {"role": role, "content": text}
    if message.get("name"):
        out["name"] = message["name"]
    return out


def same_messages(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether two conversations are the same turns: role, text and tool calls (name, arguments);
    the fields a client adds or drops (ids, refusal: null, an SDK object's defaults) do not count."""

    def key(message: dict[str, Any]) -> tuple[Any, ...]:
        calls = [((c.get("function") or {}).get("name"), call_arguments(c)) for c in message.get("tool_calls") or []]
        return message.get("role"), content_text(message.get("content")).strip(), json.dumps(calls, sort_keys=True)

    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b))


def assistant_message(text: str) -> tuple[dict[str, Any], bool]:
    """The reply to a chat request from the model's text: its well-formed `<tool_call>` blocks as
    OpenAI `tool_calls` (a malformed one stays in the content, for the harness to see), and whether
    it has any."""
    calls, kept, last = [], [], 0
    for match in TOOL_CALL.finditer(text):
        parsed = parse_tool_calls(match.group(0))
        if parsed and "error" not in parsed[0]:
            kept.append(text[last : match.start()])
            last = match.end()
            arguments = json.dumps(parsed[0]["arguments"])
            function = {"name": parsed[0]["name"], "arguments": arguments}
            calls.append({"id": f"call_{secrets.token_hex(6)}", "type": "function", "function": function})
    content = ("".join(kept) + text[last:]).strip() if calls else text
    message: dict[str, Any] = {"role": "assistant", "content": (content or None) if calls else content}
    if calls:
        message["tool_calls"] = calls
    return message, bool(calls)


def completion_body(route: str, model: str, choices: list[tuple[str, str]], usage: tuple[int, int]) -> dict[str, Any]:
    """The response to a chat or completions request: each choice's text and finish_reason."""
    created = int(time.time())
    if route == "completions":
        listed = [
            {"index": i, "text": text, "finish_reason": why, "logprobs": None} for i, (text, why) in enumerate(choices)
        ]
        kind, prefix = "text_completion", "cmpl"
    else:
        listed = []
        for i, (text, why) in enumerate(choices):
            message, called = assistant_message(text)
            reason = "tool_calls" if called and why == "stop" else why
            listed.append({"index": i, "message": message, "finish_reason": reason, "logprobs": None})
        kind, prefix = "chat.completion", "chatcmpl"
    prompt, completion = usage
    counts = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {
        "id": f"{prefix}-{secrets.token_hex(8)}",
        "object": kind,
        "created": created,
        "model": model,
        "choices": listed,
        "usage": counts,
    }


def stream_chunks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole response as the chunks of a stream: each choice's content in one delta, then its finish."""
    chat = reply["object"] == "chat.completion"
    base = {k: reply[k] for k in ("id", "created", "model")}
    kind = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    for choice in reply["choices"]:
        if chat:
            delta = dict(choice["message"])
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta.get("tool_calls") or [])] or None
            first = {"index": choice["index"], "delta": delta, "finish_reason": None}
            last = {"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}
        else:
            first = {"index": choice["index"], "text": choice["text"], "finish_reason": None}
            last = {"index": choice["index"], "text": "", "finish_reason": choice["finish_reason"]}
        chunks += [{**base, "object": kind, "choices": [first]}, {**base, "object": kind, "choices": [last]}]
    return chunks
