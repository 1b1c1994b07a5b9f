"""The `ray` import shim: a sys.meta_path finder resolving `ray` and `ray.*` to Torus modules.

Installed by `python -m torus.ray` in the driver and by the worker bootstrap in its workers.
Nothing named `ray` is installed: real Ray may sit in the same environment and is shadowed only
in processes that install this finder. `import ray.x` for a module Torus does not implement
raises an error that is both ModuleNotFoundError and NotImplementedError, naming it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

# ray module -> the module that stands in for it
ALIASES = {
    "ray": "torus",
    "ray.util": "torus.util",
    "ray.util.placement_group": "torus.util.placement_group",
    "ray.util.scheduling_strategies": "torus.util.scheduling_strategies",
    "ray.util.tpu": "torus.util.tpu",
    "ray.util.actor_pool": "torus.util.actor_pool",
    "ray.util.annotations": "torus._ray_compat.annotations",
    "ray.exceptions": "torus.exceptions",
    "ray.actor": "torus.actor",
    "ray.runtime_context": "torus.runtime_context",
    "ray.remote_function": "torus.remote_function",
    "ray.runtime_env": "torus._ray_compat.runtime_env",
    "ray.cloudpickle": "cloudpickle",
    "ray.cross_language": "torus.cross_language",
    "ray.job_config": "torus.job_config",
    "ray.train": "torus.train",
    "ray.train.jax": "torus.train.jax",
    "ray.train.v2": "torus.train",
    "ray.train.v2.jax": "torus.train.jax",
    "ray.serve": "torus.serve",
    "ray.serve.handle": "torus.serve.handle",
    "ray.serve.config": "torus.serve.config",
    "ray.serve.exceptions": "torus.serve.exceptions",
    "ray.serve.schema": "torus.serve.schema",
    "ray.serve.context": "torus.serve.context",
    "ray.serve.deployment": "torus.serve.deployment",
    "ray.serve.batching": "torus.serve.batching",
    "ray.serve.multiplex": "torus.serve.multiplex",
    "ray.serve.api": "torus.serve.api",
    "ray.serve.scripts": "torus.serve.scripts",
    "ray.data": "torus.data",
    "ray.data.context": "torus.data.context",
    "ray.data.dataset": "torus.data.dataset",
    "ray.data.iterator": "torus.data.iterator",
    "ray.data.aggregate": "torus.data.aggregate",
    "ray.data.block": "torus.data.block",
    "ray.data.expressions": "torus.data.expressions",
    "ray.data.datasource": "torus.data.datasource",
}


class ShimNotImplemented(ModuleNotFoundError, NotImplementedError):
    pass


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # already executed under its own name


class _Missing(importlib.abc.Loader):
    def create_module(self, spec):
        raise ShimNotImplemented(f"{spec.name} is not implemented by Torus (`ray` is Torus "
                                 f"here: python -m torus.ray)", name=spec.name)

    def exec_module(self, module):
        pass


class RayShimFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "ray" and not fullname.startswith("ray."):
            return None
        tgt = ALIASES.get(fullname)
        if tgt is None:
            return importlib.machinery.ModuleSpec(fullname, _Missing())
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(tgt),
                                              is_package=fullname in ("ray", "ray.util", "ray.train",
                                                                      "ray.train.v2", "ray.serve"))
        return spec


_finder = RayShimFinder()


def install() -> None:
    """Puts the finder first; drops any real `ray` already imported in this process."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in [n for n in sys.modules if n == "ray" or n.startswith("ray.")]:
        mod = sys.modules[name]
        if not getattr(mod, "__name__", "").startswith(("torus", "cloudpickle")):
            del sys.modules[name]


def installed() -> bool:
    return _finder in sys.meta_path
