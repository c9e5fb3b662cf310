"""A stand-in OpenAI-compatible chat server (``/v1/chat/completions``) for the env-LLM and judge tests."""

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Stub:
    """A chat server on 127.0.0.1 whose behaviour each test scripts: a list of HTTP statuses to
    answer before succeeding, an optional delay, the reply to the last message (``reply``, "echo: ..."
    by default); the requests it saw are kept."""

    def __init__(self, reply: Callable[[str], str] = lambda question: f"echo: {question}"):
        self.reply = reply
        self.failures: list[int] = []
        self.delay_s = 0.0
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"path": self.path, "body": body})
                time.sleep(stub.delay_s)
                if stub.failures:
                    self._send(stub.failures.pop(0), {"error": "scripted failure"})
                    return
                question = body["messages"][-1]["content"]
                self._send(200, {
                    "choices": [{"message": {"role": "assistant", "content": stub.reply(question)},
                                 "finish_reason": "length" if "long" in question else "stop"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3},
                })

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # a client's concurrent requests all wait their turn (the default, 5, refuses some)

            def handle_error(self, request, client_address):
                pass  # a client that timed out closed its end: nothing to report

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
