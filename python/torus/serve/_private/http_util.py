"""HTTP between proxy and replica: the request as an ASGI scope plus its body, the answer as
ASGI messages, and the conversion of a handler's plain return value into a response (Ray's
rule: None and bytes as text/plain, str as UTF-8 text, anything else as compact JSON).

No state, no threads.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

# Scope keys the replica needs; the rest of uvicorn's scope (the server's state, extensions)
# stays in the proxy.
_SCOPE_KEYS = ("type", "http_version", "method", "scheme", "path", "raw_path", "query_string",
               "headers", "client", "server")


def scope_for_replica(scope: Dict[str, Any], route_prefix: str) -> Dict[str, Any]:
    out = {k: scope[k] for k in _SCOPE_KEYS if k in scope}
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", ())]
    out["root_path"] = "" if route_prefix == "/" else route_prefix.rstrip("/")
    out["asgi"] = {"version": "3.0", "spec_version": "2.4"}
    out["state"] = {}
    if out.get("client") is not None:
        out["client"] = tuple(out["client"])
    if out.get("server") is not None:
        out["server"] = tuple(out["server"])
    return out


def object_to_messages(obj: Any, status_code: int = 200) -> List[dict]:
    if obj is None:
        body, ctype = b"", b"text/plain"
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        body, ctype = bytes(obj), b"text/plain"
    elif isinstance(obj, str):
        body, ctype = obj.encode("utf-8"), b"text/plain; charset=utf-8"
    else:
        try:
            from fastapi.encoders import jsonable_encoder
            obj = jsonable_encoder(obj)
        except ImportError:
            pass
        body, ctype = json.dumps(obj, separators=(",", ":")).encode(), b"application/json"
    return [{"type": "http.response.start", "status": status_code,
             "headers": [(b"content-type", ctype),
                         (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body}]


def plain_response(status: int, text: str, extra_headers=()) -> Dict[str, Any]:
    """An answer the proxy makes itself (404, 503, 500)."""
    body = text.encode()
    return {"status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode())] + list(extra_headers),
            "body": body, "stream_id": None, "done": True}
