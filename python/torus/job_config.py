"""`JobConfig` (Ray's `ray.job_config.JobConfig`): settings of the job a driver starts."""
from __future__ import annotations

from typing import Any, Dict, List, Optional


class JobConfig:
    """What `init(job_config=...)` takes from it: `code_search_path` (directories or `.so` files
    of C++ functions that Python calls through `cross_language`), `runtime_env` (its
    `env_vars`), `default_actor_lifetime` ("detached" or "non_detached") and `ray_namespace`.
    `metadata` is kept but unused; other settings raise NotImplementedError naming them."""

    def __init__(self, jvm_options: Optional[List[str]] = None,
                 code_search_path: Optional[List[str]] = None,
                 runtime_env: Optional[Dict[str, Any]] = None,
                 _client_job: bool = False,
                 metadata: Optional[Dict[str, str]] = None,
                 ray_namespace: Optional[str] = None,
                 default_actor_lifetime: str = "non_detached",
                 _py_driver_sys_path: Optional[List[str]] = None):
        if jvm_options:
            raise NotImplementedError("JobConfig(jvm_options=...): Java workers are not "
                                      "implemented by Torus")
        if default_actor_lifetime not in ("detached", "non_detached"):
            raise ValueError("default_actor_lifetime must be one of 'detached', 'non_detached'")
        self.code_search_path = list(code_search_path or [])
        self.runtime_env = runtime_env or {}
        self.metadata = dict(metadata or {})
        self.ray_namespace = ray_namespace
        self.default_actor_lifetime = default_actor_lifetime

    def set_metadata(self, key: str, value: str) -> None:
        self.metadata[key] = value

    def set_runtime_env(self, runtime_env: Optional[Dict[str, Any]], validate: bool = False) -> None:
        self.runtime_env = runtime_env or {}

    def set_ray_namespace(self, ray_namespace: str) -> None:
        self.ray_namespace = ray_namespace

    def set_default_actor_lifetime(self, default_actor_lifetime: str) -> None:
        self.default_actor_lifetime = default_actor_lifetime
