"""A scripted fake of the Anthropic Messages API on 127.0.0.1, for tests of the LLM agents.

It speaks real HTTP, so the real `anthropic` client (and a daemon started with ANTHROPIC_BASE_URL
pointing here) talks to it unchanged. Each POST /v1/messages takes the next reply of the script:

    with FakeAnthropic([overloaded(), tool_turn(("read_file", {"path": "candidate/train.py"})),
                        tool_turn(("submit", {"description": "raise lr"}))]) as server:
        os.environ["ANTHROPIC_BASE_URL"] = server.url
        ...
    server.requests   # every request received: {"path", "headers", "body"}

A script item may also be a function of the request body that returns a reply, so a test can react
to the tool results the agent sent. When the script runs out the server answers 400, which fails the
test visibly instead of hanging.

For a manual try of the daemon, it also runs from a JSON script, each item either a tool turn or a
raw reply:

    python -m tests.fake_anthropic script.json --port 8765
    # script.json: [{"status": 529, "body": {"type": "error", "error": {"type": "overloaded_error",
    #                "message": "Overloaded"}}},
    #               {"tools": [["edit_file", {"path": "candidate/train.py", "old": "...", "new": "..."}]]},
    #               {"tools": [["submit", {"description": "..."}]], "usage": {"input_tokens": 5000}}]
    ANTHROPIC_API_KEY=x ANTHROPIC_BASE_URL=http://127.0.0.1:8765 python -m orchestrator run ...
"""
from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional, Union

_ids = itertools.count(1)


@dataclass
class Reply:
    status: int
    body: dict
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0          # wait before answering (to trigger client timeouts)


Script = list[Union[Reply, Callable[[dict], Reply]]]


def usage(input_tokens: int = 1000, output_tokens: int = 100, cache_write: int = 0,
          cache_read: int = 0) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read}


def message(content: list[dict], stop_reason: str, usage_fields: Optional[dict] = None,
            model: str = "claude-sonnet-4-5") -> Reply:
    return Reply(200, {
        "id": f"msg_fake_{next(_ids)}", "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason, "stop_sequence": None,
        "usage": usage_fields or usage(),
    })


def tool_turn(*calls: tuple[str, dict], text: str = "", usage_fields: Optional[dict] = None,
              stop_reason: str = "tool_use") -> Reply:
    """An assistant turn calling the given tools: tool_turn(("run", {"command": "ls"}), ...)."""
    content: list[dict] = [{"type": "text", "text": text}] if text else []
    for name, arguments in calls:
        content.append({"type": "tool_use", "id": f"toolu_fake_{next(_ids)}", "name": name,
                        "input": arguments})
    return message(content, stop_reason, usage_fields)


def text_turn(text: str, usage_fields: Optional[dict] = None) -> Reply:
    return message([{"type": "text", "text": text}], "end_turn", usage_fields)


def error(status: int, kind: str, text: str, headers: Optional[dict] = None) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": text}},
                 headers or {})


def overloaded() -> Reply:
    return error(529, "overloaded_error", "Overloaded")


def rate_limited(retry_after_s: float) -> Reply:
    return error(429, "rate_limit_error", "Rate limited", {"retry-after": str(retry_after_s)})


def slow(reply: Reply, delay_s: float) -> Reply:
    return Reply(reply.status, reply.body, reply.headers, delay_s)


def tool_results(body: dict) -> list[dict]:
    """The tool_result blocks of the last user message of a request body."""
    last = body["messages"][-1]
    if last["role"] != "user" or isinstance(last["content"], str):
        return []
    return [block for block in last["content"] if block.get("type") == "tool_result"]


def result_text(block: dict) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return content


class FakeAnthropic:
    def __init__(self, script: Script, port: int = 0):
        self.script = list(script)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeAnthropic":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def next_reply(self, request: dict) -> Reply:
        with self.lock:
            self.requests.append(request)
            if not self.script:
                return error(400, "invalid_request_error", "fake server: the script ran out")
            item = self.script.pop(0)
        return item(request["body"]) if callable(item) else item

    @property
    def message_requests(self) -> list[dict]:
        return [request for request in self.requests if request["path"].startswith("/v1/messages")]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeAnthropic
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"unparsed": raw.decode(errors="replace")}
        request = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                   "body": body, "time": time.monotonic()}
        if not self.path.startswith("/v1/messages"):
            reply = error(404, "not_found_error", f"fake server: no route {self.path}")
            self.fake.requests.append(request)
        else:
            reply = self.fake.next_reply(request)
        if reply.delay_s:
            time.sleep(reply.delay_s)
        payload = json.dumps(reply.body).encode()
        try:
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the client gave up waiting (a timeout test)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def reply_from_json(item: dict) -> Reply:
    if "tools" in item:
        return tool_turn(*[(name, arguments) for name, arguments in item["tools"]],
                         text=item.get("text", ""), usage_fields=usage(**{
                             {"cache_creation_input_tokens": "cache_write",
                              "cache_read_input_tokens": "cache_read"}.get(k, k): v
                             for k, v in item.get("usage", {}).items()}))
    return Reply(item.get("status", 200), item["body"], item.get("headers", {}),
                 item.get("delay_s", 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description="a scripted fake Messages API on 127.0.0.1")
    parser.add_argument("script", help="JSON list of replies")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    with open(args.script) as file:
        script = [reply_from_json(item) for item in json.load(file)]
    fake = FakeAnthropic(script, port=args.port)
    print(f"fake Messages API on {fake.url} with {len(script)} replies; Ctrl-C stops it", flush=True)
    try:
        fake.server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
