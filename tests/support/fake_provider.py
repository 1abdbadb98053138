"""A payment API on 127.0.0.1 that honours ``Idempotency-Key``, as Stripe does: no network.

``POST /v1/charges`` (Stripe's form-encoded body, for its Python SDK pointed here
with ``stripe.api_base``) and ``POST /charges`` (JSON) make a charge; a request
with a key already seen answers the first response again and charges nothing.
A charge keeps its ``metadata`` (``metadata[name]=value`` in Stripe's form), and
``GET /v1/charges/search?query=metadata['name']:'value'`` finds it, as Stripe's
search does (one clause of that form only). ``GET /charges?idempotency_key=K``
says what became of a key (404: never seen), for resolvers of other providers.
``calls`` counts every request that made or replayed a charge; ``charges`` holds
the charges made.

"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class FakeProvider:
    def __init__(self) -> None:
        self.charges: list[dict[str, Any]] = []
        self.calls: list[str] = []  # the Idempotency-Key of each charge request, "" if none
        self._answers: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def charge(self, key: str, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.calls.append(key)
            if key and key in self._answers:
                return self._answers[key]  # the first answer again: no second charge
            charge = {
                "id": f"ch_{len(self.charges) + 1}",
                "object": "charge",
                "amount": int(params.get("amount", 0)),
                "currency": str(params.get("currency", "eur")),
                "status": "succeeded",
                "idempotency_key": key,
                "metadata": _metadata(params),
            }
            self.charges.append(charge)
            if key:
                self._answers[key] = charge
            return charge

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._answers.get(key)

    def search(self, query: str) -> list[dict[str, Any]]:
        clause = _METADATA_CLAUSE.fullmatch(query.strip())
        if clause is None:
            raise ValueError(f"the fake provider searches metadata['k']:'v' only, not {query!r}")
        name, value = clause.groups()
        with self._lock:
            return [c for c in self.charges if c["metadata"].get(name) == value]


_METADATA_CLAUSE = re.compile(r"metadata\['([^']+)'\]:'([^']*)'")


def _metadata(params: dict[str, Any]) -> dict[str, str]:
    """Stripe's form sends ``metadata[name]=value``; a JSON body, a ``metadata`` object."""
    found = dict(params.get("metadata") or {})
    for name, value in params.items():
        if name.startswith("metadata[") and name.endswith("]"):
            found[name[len("metadata[") : -1]] = str(value)
    return found


def _handler(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode()
            path = urlsplit(self.path).path
            if path == "/v1/charges":
                params: dict[str, Any] = {k: v[0] for k, v in parse_qs(raw).items()}
            elif path == "/charges":
                params = json.loads(raw or "{}")
            else:
                return self._answer(404, {"error": {"message": f"no route {path}"}})
            key = self.headers.get("Idempotency-Key", "")
            self._answer(200, provider.charge(key, params))

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/v1/charges/search":
                query = parse_qs(url.query).get("query", [""])[0]
                found = provider.search(query)
                result = {"object": "search_result", "url": url.path, "has_more": False}
                return self._answer(200, {**result, "data": found, "next_page": None})
            key = parse_qs(url.query).get("idempotency_key", [""])[0]
            found = provider.lookup(key) if url.path == "/charges" else None
            if found is None:
                return self._answer(404, {"error": {"message": "no charge for this key"}})
            self._answer(200, found)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: pytest shows the test's own output

    return Handler
