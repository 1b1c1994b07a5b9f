"""`@serve.ingress(app)`: a FastAPI (or any ASGI) app as a deployment's HTTP entry point.

FastAPI routes declared on the class's methods (`@app.get("/x") def f(self, ...)`) are rebuilt so
that `self` is a FastAPI dependency resolving to the replica's instance of the class; FastAPI
then analyses each endpoint again, so path, query and body parameters work as on a plain app.
Runs once, when the decorator is applied, in the process that defines the class.
"""
from __future__ import annotations

import inspect


def _class_routes(app, cls):
    prefixes = tuple(base.__qualname__ + "." for base in cls.__mro__ if base is not object)
    out = []
    for route in list(getattr(app, "routes", [])):
        ep = getattr(route, "endpoint", None)
        if ep is not None and getattr(ep, "__qualname__", "").startswith(prefixes):
            out.append(route)
    return out


def make_class_based_view(app, cls) -> None:
    from fastapi import APIRouter, Depends
    from fastapi.routing import APIRoute, APIWebSocketRoute

    async def current_instance():
        from torus.serve.context import get_replica_context
        return get_replica_context().servable_object

    routes = _class_routes(app, cls)
    if not routes:
        return
    router = APIRouter()
    for route in routes:
        app.router.routes.remove(route)
        old = route.endpoint
        sig = inspect.signature(old)
        params = list(sig.parameters.values())
        if not params:
            raise TypeError(f"route {route.path} of {cls.__name__} takes no `self`")
        first = params[0].replace(default=Depends(current_instance))
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params[1:]
                if p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                  inspect.Parameter.VAR_KEYWORD)]
        new_sig = sig.replace(parameters=[first] + rest)
        if inspect.iscoroutinefunction(old):
            async def endpoint(*args, __old=old, **kwargs):
                return await __old(*args, **kwargs)
        else:
            def endpoint(*args, __old=old, **kwargs):
                return __old(*args, **kwargs)
        endpoint.__signature__ = new_sig
        endpoint.__name__ = old.__name__
        endpoint.__qualname__ = old.__qualname__
        endpoint.__doc__ = old.__doc__
        endpoint.__annotations__ = getattr(old, "__annotations__", {})
        if isinstance(route, APIRoute):
            router.add_api_route(
                route.path, endpoint, response_model=route.response_model,
                status_code=route.status_code, tags=route.tags,
                dependencies=route.dependencies, summary=route.summary,
                description=route.description,
                response_description=route.response_description,
                responses=route.responses, deprecated=route.deprecated,
                methods=route.methods, operation_id=route.operation_id,
                response_model_include=route.response_model_include,
                response_model_exclude=route.response_model_exclude,
                response_model_by_alias=route.response_model_by_alias,
                response_model_exclude_unset=route.response_model_exclude_unset,
                response_model_exclude_defaults=route.response_model_exclude_defaults,
                response_model_exclude_none=route.response_model_exclude_none,
                include_in_schema=route.include_in_schema,
                response_class=route.response_class, name=route.name,
                callbacks=route.callbacks, openapi_extra=route.openapi_extra)
        elif isinstance(route, APIWebSocketRoute):
            router.add_api_websocket_route(route.path, endpoint, name=route.name)
    app.include_router(router)


def ingress(app):
    """`@serve.ingress(app)` on a deployment class: HTTP requests go through `app`."""
    if not callable(app):
        raise ValueError("serve.ingress expects an ASGI app (a FastAPI app, a starlette app "
                         "or an ASGI callable)")

    def decorate(cls):
        if not inspect.isclass(cls):
            raise ValueError("@serve.ingress must be applied to a class.")
        if hasattr(app, "routes") and hasattr(app, "include_router"):
            make_class_based_view(app, cls)
        cls._serve_asgi_app = app
        return cls

    return decorate
