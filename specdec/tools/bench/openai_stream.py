"""One benchmark user through an OpenAI-compatible server: ours (`specdec serve --http-port`) or a peer's.

`http_stream(model)` is a `concurrency.run_level` stream: POST /v1/completions with stream: true,
greedy, its tokens counted from the usage chunk (`stream_options.include_usage`, which llama-server
and vLLM honour as OpenAI does). `served_model(url)` is the first id GET /v1/models lists.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit


def http_stream(model: str, extra: dict | None = None):
    """A `run_level` stream for the server at the endpoint it is given (a base URL); `extra` joins every request's
    body (e.g. llama-server's {"cache_prompt": false})."""
    def stream(base_url: str, prompt: str, n: int, gamma: int | None, level, lock: threading.Lock) -> None:
        url = urlsplit(base_url)
        body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, **({} if gamma is None else {"gamma": gamma}),
                **(extra or {})}
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        began = time.perf_counter()
        first, tokens = None, None
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"{base_url}: HTTP {response.status}: {response.read()[:500]!r}")
            for raw in response:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif first is None and any(choice.get("text") for choice in chunk.get("choices", ())):
                    first = time.perf_counter() - began
        finally:
            conn.close()
        if tokens is None:
            raise RuntimeError(f"{base_url}: the stream ended without a usage chunk (stream_options.include_usage)")
        with lock:
            level.tokens += tokens
            if first is not None:
                level.first_token_s.append(first)
    return stream


def http_get(url: str) -> bytes:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", parts.path)
        return conn.getresponse().read()
    finally:
        conn.close()


def served_model(base_url: str) -> str:
    """The first model id the server at `base_url` lists (GET /v1/models)."""
    return json.loads(http_get(base_url.rstrip("/") + "/v1/models"))["data"][0]["id"]
