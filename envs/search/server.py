"""A Search-R1-style retrieval server over a local BM25 index (stdlib `http.server`).

    python -m agentrl.envs.search.server --port 8000        # serves the ISO corpus

Endpoints (JSON):
    POST /retrieve   {"queries": [str], "topk": int, "return_scores": bool}
                     → {"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}
                       (bare {"id", "contents"} hits when return_scores is false, as Search-R1)
    POST /documents  {"ids": [str]} → {"result": [{"id", "contents"} | null, ...]}   (for `open`)
    GET  /health     → {"status": "ok", "documents": int}

It binds 127.0.0.1 unless told otherwise. Bad requests get HTTP 400 with {"error": reason}.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentrl.envs.search.retriever import BM25Retriever, Hit

MAX_TOPK = 100
MAX_QUERIES = 1024


class BadRequest(ValueError):
    pass


def _contents(title: str, text: str) -> str:
    return f'"{title}"\n{text}'


def handle_retrieve(retriever: BM25Retriever, body: Any) -> dict[str, Any]:
    """The /retrieve reply for a parsed request body (pure; raises BadRequest on bad input)."""
    if not isinstance(body, dict) or not isinstance(body.get("queries"), list):
        raise BadRequest("body must be an object with 'queries': a list of strings")
    queries = body["queries"]
    if not all(isinstance(q, str) for q in queries) or len(queries) > MAX_QUERIES:
        raise BadRequest(f"'queries' must be at most {MAX_QUERIES} strings")
    topk = body.get("topk", 3)
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise BadRequest(f"'topk' must be an integer in [1, {MAX_TOPK}], got {topk!r}")
    with_scores = bool(body.get("return_scores", False))

    def item(h: Hit) -> dict[str, Any]:
        doc = {"id": h.id, "contents": _contents(h.title, h.text)}
        return {"document": doc, "score": h.score} if with_scores else doc

    return {"result": [[item(h) for h in hits] for hits in retriever.retrieve_sync(queries, topk)]}


def handle_documents(retriever: BM25Retriever, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("ids"), list) \
            or not all(isinstance(i, str) for i in body["ids"]):
        raise BadRequest("body must be an object with 'ids': a list of strings")
    docs = [retriever.get(i) for i in body["ids"]]
    return {"result": [{"id": d.id, "contents": d.contents} if d else None for d in docs]}


def _handler(retriever: BM25Retriever) -> type[BaseHTTPRequestHandler]:
    routes = {"/retrieve": handle_retrieve, "/documents": handle_documents}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, {"status": "ok", "documents": len(retriever.documents)})
            else:
                self._reply(404, {"error": f"no such endpoint: GET {self.path}"})

        def do_POST(self) -> None:
            route = routes.get(self.path)
            if route is None:
                self._reply(404, {"error": f"no such endpoint: POST {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"null")
                self._reply(200, route(retriever, body))
            except (BadRequest, json.JSONDecodeError, ValueError) as e:
                self._reply(400, {"error": f"bad request: {e}"})

        def log_message(self, format: str, *args: Any) -> None:  # quiet: no stderr line per request
            pass

    return Handler


class RetrievalServer:
    """The server in a background thread: `with RetrievalServer(retriever) as srv: srv.url`."""

    def __init__(self, retriever: BM25Retriever | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.retriever = retriever or BM25Retriever()
        self.retriever.index()  # build before accepting requests
        self.httpd = ThreadingHTTPServer((host, port), _handler(self.retriever))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RetrievalServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="retrieval-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Search-R1-style retrieval server over the ISO corpus (BM25)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server = RetrievalServer(host=args.host, port=args.port)
    print(f"retrieval server on {server.url} ({len(server.retriever.documents)} documents)", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
