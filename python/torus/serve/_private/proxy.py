"""The HTTP proxy of one node: a uvicorn server (httptools, uvloop) that sends each request to
the ingress deployment of the application whose `route_prefix` is the longest match.

The controller runs one proxy per machine (per host name: the simulated hosts of `torus up` share
one), so the port is never shared: a port something else holds (another cluster's proxy, any
program) fails the start with that reason. Answers of its own: 404 for a path no application serves, 503 when the
deployment's queue is full (`max_queued_requests`) or it failed to deploy, 500 when the handler
raised or its replica died while holding the request, 408 past `request_timeout_s`.
`/-/routes` lists the routes and `/-/healthz` says whether the proxy is up.

Threading: an actor whose calls (`ready`, `check_health`, `shutdown`) run on the actor's
threads; uvicorn runs on a thread of its own with its own event loop, where every request is
handled; the route table comes from a long-poll thread and is swapped whole (no lock needed to
read it).
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from torus.serve._private import http_util
from torus.serve._private import metrics as _metrics
from torus.serve._private import router as _router
from torus.serve._private.long_poll import LongPollClient

logger = logging.getLogger("torus.serve")


class ServeProxy:
    def __init__(self, http_options: Dict[str, Any], node_id: str):
        self._opts = http_options
        self._node_id = node_id
        self._routes: List[Tuple[str, str, str]] = []  # (prefix, app, ingress), longest first
        self._server = None
        self._thread: Optional[threading.Thread] = None
        self._started = threading.Event()
        self._error: Optional[str] = None
        self._port = int(http_options.get("port") or 8000)
        self._poll: Optional[LongPollClient] = None
        self._requests = 0
        self._ongoing = 0

    async def ready(self) -> int:
        if self._thread is None:
            self._poll = LongPollClient("routes", self._update_routes)
            self._thread = threading.Thread(target=self._serve, name="serve-http", daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._started.wait, 30)
        if self._error:
            raise RuntimeError(self._error)
        if not self._started.is_set():
            raise RuntimeError("the HTTP proxy did not start within 30 s")
        return self._port

    async def check_health(self) -> Dict[str, Any]:
        """Raises if the server is down; else this proxy's metrics (for the controller)."""
        if self._error or (self._thread is not None and not self._thread.is_alive()):
            raise RuntimeError(self._error or "the HTTP server thread ended")
        reg = _metrics.REGISTRY
        reg.set("ray_serve_num_ongoing_http_requests", {"node_id": self._node_id},
                self._ongoing)
        for (app, dep), r in list(_router._routers.items()):
            sent, queued = r.ongoing()
            reg.set("ray_serve_deployment_queued_queries",
                    {"deployment": dep, "application": app, "node_id": self._node_id}, queued)
        return {"metrics": reg.snapshot()}

    async def shutdown(self) -> None:
        if self._poll is not None:
            self._poll.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)

    # --- routes -------------------------------------------------------------------------------
    def _update_routes(self, routes) -> None:
        routes = routes or {}
        table = sorted(((p, a, i) for p, (a, i) in routes.items()), key=lambda t: -len(t[0]))
        for _, app, ingress in table:  # warm the routers here, not on a request
            try:
                _router.get_router(app, ingress)
            except Exception:
                logger.exception("serve: router for %s/%s", app, ingress)
        self._routes = table

    def _match(self, path: str):
        for prefix, app, ingress in self._routes:
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                return prefix, app, ingress
        return None

    # --- the server ---------------------------------------------------------------------------
    def _serve(self) -> None:
        import uvicorn
        host = self._opts.get("host") or "127.0.0.1"
        try:
            fam = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(fam, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, self._port))
            sock.listen(2048)
            sock.setblocking(False)
        except OSError as e:
            self._error = (f"Serve's HTTP proxy could not listen on {host}:{self._port}: "
                           f"{e.strerror or e}")
            self._started.set()
            return
        try:
            import uvloop
            loop_kind = "uvloop"
        except ImportError:
            uvloop, loop_kind = None, "asyncio"
        config = uvicorn.Config(self._asgi, host=host, port=self._port, loop=loop_kind,
                                http="httptools", lifespan="off", interface="asgi3", log_level="warning",
                                access_log=False, ws="none",
                                timeout_keep_alive=int(self._opts.get("keep_alive_timeout_s")
                                                       or 90))
        server = uvicorn.Server(config)
        self._server = server
        if uvloop is not None:
            loop = uvloop.new_event_loop()
        else:
            loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def run():
            task = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started and not task.done():
                await asyncio.sleep(0.01)
            self._started.set()
            await task

        try:
            loop.run_until_complete(run())
        except Exception as e:
            self._error = f"Serve's HTTP proxy stopped: {e}"
            logger.exception("serve: HTTP server")
        finally:
            self._started.set()

    async def _asgi(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        path = scope["path"]
        if path == "/-/routes":
            body = json.dumps({p: a for p, a, _ in self._routes}).encode()
            await _send_plain(send, 200, body, b"application/json")
            return
        if path == "/-/healthz":
            await _send_plain(send, 200, b"success", b"text/plain")
            return
        m = self._match(path)
        if m is None and await self._refresh_routes():
            m = self._match(path)  # the table was behind the controller's
        if m is None:
            await _send_plain(send, 404, (
                f"Path '{path}' not found. Ping http://.../-/routes for available "
                f"routes.").encode(), b"text/plain; charset=utf-8")
            return
        prefix, app, ingress = m
        self._ongoing += 1
        t0 = time.monotonic()
        status = 500
        try:
            status = await self._forward(scope, receive, send, prefix, app, ingress)
        finally:
            self._ongoing -= 1
            labels = {"route": prefix, "method": scope.get("method", ""), "application": app}
            reg = _metrics.REGISTRY
            reg.inc("ray_serve_num_http_requests_total", dict(labels, status_code=str(status)))
            if status >= 400:
                reg.inc("ray_serve_num_http_error_requests_total",
                        dict(labels, error_code=str(status)))
            reg.observe("ray_serve_http_request_latency_ms",
                        {"route": prefix, "application": app, "status_code": str(status)},
                        (time.monotonic() - t0) * 1000)

    async def _forward(self, scope, receive, send, prefix: str, app: str, ingress: str) -> int:
        """Sends one request to its application; returns the status answered (499: the client
        left first)."""
        chunks = []
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return 499
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        headers = dict(scope.get("headers") or ())
        request_id = (headers.get(b"x-request-id") or uuid.uuid4().hex.encode()).decode(
            "latin-1")
        meta = {"method": "__call__", "route": prefix, "request_id": request_id}
        model = headers.get(b"serve_multiplexed_model_id")
        if model:
            meta["multiplexed_model_id"] = model.decode("latin-1")
        self._requests += 1
        call = asyncio.ensure_future(self._call(app, ingress, meta,
                                                http_util.scope_for_replica(scope, prefix),
                                                body))
        gone = asyncio.ensure_future(_disconnected(receive))
        done, _ = await asyncio.wait([call, gone], return_when=asyncio.FIRST_COMPLETED)
        if call not in done:  # the client left first: cancel the request
            call.cancel()
            try:
                await call
            except BaseException:
                pass
            return 499
        gone.cancel()
        answer = call.result()
        extra = [(b"x-request-id", request_id.encode("latin-1"))]
        await send({"type": "http.response.start", "status": answer["status"],
                    "headers": list(answer["headers"]) + extra})
        if answer.get("stream_id") is None:
            await send({"type": "http.response.body", "body": answer["body"]})
            return answer["status"]
        await send({"type": "http.response.body", "body": answer["body"], "more_body": True})
        replica = answer["_replica"]
        sid = answer["stream_id"]
        from torus.serve.handle import _await_ref
        try:
            while True:
                batch = await _await_ref(replica.stream_next.remote(sid))
                for chunk in batch["items"]:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if batch["done"]:
                    break
        except Exception as e:
            logger.warning("serve: a streaming response ended early: %s", e)
        finally:
            answer["_release"]()
        await send({"type": "http.response.body", "body": b""})
        return answer["status"]

    async def _refresh_routes(self) -> bool:
        """Fetches the route table now (a path matched nothing: maybe an application deployed
        a moment ago). True if the table changed."""
        from torus.serve._private.long_poll import get_controller
        from torus.serve.handle import _await_ref
        c = get_controller()
        if c is None:
            return False
        try:
            _, routes = await asyncio.wait_for(
                _await_ref(c.listen_for_change.options(name="serve.routes").remote(
                    "routes", None)), 2.0)
        except Exception:
            return False
        before = self._routes
        self._update_routes(routes)
        return self._routes != before

    async def _call(self, app: str, ingress: str, meta, scope, body) -> Dict[str, Any]:
        from torus.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError
        from torus.serve.exceptions import BackPressureError, DeploymentUnavailableError
        from torus.serve.handle import DeploymentResponse
        try:
            router = _router.get_router(app, ingress)
            resp = DeploymentResponse(router)
            req = _router.Request("handle_http", meta, (scope, body), {}, resp)
            router.submit(req)
            timeout = self._opts.get("request_timeout_s")
            deadline = None if not timeout else time.monotonic() + timeout
            from torus.serve.handle import _await_ref
            try:
                for attempt in range(4):
                    await resp._wait_assigned_async()
                    fut = _await_ref(resp._ref)
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    try:
                        answer = await (asyncio.wait_for(fut, left) if deadline else fut)
                        break
                    except (ActorDiedError, ActorUnavailableError) as e:
                        # Never sent (the replica was already dead): route it again.
                        if attempt < 3 and resp._resubmit(e):
                            continue
                        raise
            except asyncio.TimeoutError:
                resp.cancel()
                resp._release()
                return http_util.plain_response(408, "Request timed out.")
            except asyncio.CancelledError:  # the client disconnected
                resp.cancel()
                resp._release()
                raise
            except BaseException:
                resp._release()
                raise
            if answer.get("stream_id") is not None:
                answer["_replica"] = resp._actor
                answer["_release"] = resp._release
            else:
                resp._release()
            return answer
        except BackPressureError as e:
            return http_util.plain_response(e.status_code, e.message,
                                            [(b"retry-after", b"1")])
        except DeploymentUnavailableError as e:
            return http_util.plain_response(503, e.message)
        except (ActorDiedError, ActorUnavailableError) as e:
            if 'resp' in locals():
                resp._replica_error(e)
            return http_util.plain_response(
                500, f"The replica handling this request died before answering it: "
                     f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
        except RayTaskError as e:
            if isinstance(e, BackPressureError):
                return http_util.plain_response(503, str(e), [(b"retry-after", b"1")])
            return http_util.plain_response(500, "Internal Server Error")
        except Exception:
            logger.exception("serve: proxy error")
            return http_util.plain_response(500, "Internal Server Error")


async def _disconnected(receive) -> None:
    """Returns when the client has gone (the body was read already)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def _send_plain(send, status: int, body: bytes, ctype: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
