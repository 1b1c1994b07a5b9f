"""The `serve` command (Ray Serve's CLI): run, deploy, status, config, shutdown, build.

- `serve run TARGET` (TARGET: `module:app` or a config YAML) connects as a driver (`--address`,
  else RAY_ADDRESS/TORUS_ADDRESS, else the local cluster, else a new local one), deploys, and
  serves until Ctrl-C, then shuts Serve down; `--non-blocking` returns once it runs.
- `serve deploy CONFIG`, `serve status`, `serve config`, `serve shutdown` call Serve's REST API
  on the dashboard (`--address`, else RAY_DASHBOARD_ADDRESS, else the latest local session's
  dashboard, else http://localhost:8265) with the cluster token (RAY_AUTH_TOKEN, TORUS_TOKEN,
  or the latest local session's).
- `serve build module:app [-o FILE]` prints a config file for the application.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Optional


def _session() -> Optional[Path]:
    root = Path(os.environ.get("TORUS_TMPDIR") or "/tmp/torus")
    latest = root / "session_latest"
    return latest if latest.exists() else None


def _dashboard(address: Optional[str]) -> str:
    addr = address or os.environ.get("RAY_DASHBOARD_ADDRESS")
    if not addr:
        s = _session()
        f = s / "dashboard_address" if s else None
        addr = f.read_text().strip() if f and f.is_file() else "localhost:8265"
    if not addr.startswith(("http://", "https://")):
        addr = "http://" + addr
    return addr.rstrip("/")


def _token() -> Optional[str]:
    t = os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("TORUS_TOKEN")
    if t:
        return t.strip()
    s = _session()
    f = s / "token" if s else None
    return f.read_text().strip() if f and f.is_file() else None


def _rest(method: str, address: Optional[str], body: Optional[bytes] = None):
    url = _dashboard(address) + "/api/serve/applications/"
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    tok = _token()
    if tok:
        req.add_header("Authorization", f"Bearer {tok}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        sys.exit(f"serve: cannot reach the dashboard at {url}: {e}")


def _load_config(path: str) -> Dict[str, Any]:
    import yaml
    try:
        with open(path) as f:
            cfg = yaml.safe_load(f)
    except FileNotFoundError:
        sys.exit(f"serve: no such config file: {path}")
    except yaml.YAMLError as e:
        sys.exit(f"serve: {path} is not valid YAML: {e}")
    if not isinstance(cfg, dict):
        sys.exit(f"serve: {path} must hold a mapping (a Serve config), not "
                 f"{type(cfg).__name__}")
    from torus.serve.schema import ServeDeploySchema
    from pydantic import ValidationError
    try:
        ServeDeploySchema(**cfg)
    except ValidationError as e:
        sys.exit(f"serve: {path} is not a valid Serve config:\n{e}")
    return cfg


def _absolute_paths(cfg: Dict[str, Any], base: str) -> Dict[str, Any]:
    """The config with its applications' local working_dir / py_modules paths made absolute,
    relative to the config file's directory (the controller packs them where it runs)."""
    def fix(p):
        if not isinstance(p, str) or "://" in p or os.path.isabs(os.path.expanduser(p)):
            return p
        return os.path.normpath(os.path.join(base, p))
    for app in cfg.get("applications") or []:
        env = app.get("runtime_env")
        if isinstance(env, dict):
            if "working_dir" in env:
                env["working_dir"] = fix(env["working_dir"])
            if isinstance(env.get("py_modules"), list):
                env["py_modules"] = [fix(m) for m in env["py_modules"]]
    return cfg


def _local_working_dir(env) -> Optional[str]:
    wd = (env or {}).get("working_dir")
    return wd if isinstance(wd, str) and "://" not in wd and os.path.isdir(wd) else None


def _flag_runtime_env(a) -> Dict[str, Any]:
    """`serve run`'s --runtime-env (a YAML file), --runtime-env-json and --working-dir."""
    import yaml
    env: Dict[str, Any] = {}
    if a.runtime_env:
        try:
            with open(a.runtime_env) as f:
                env = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as e:
            sys.exit(f"serve: cannot read --runtime-env {a.runtime_env}: {e}")
    if a.runtime_env and a.runtime_env_json:
        sys.exit("serve: give --runtime-env or --runtime-env-json, not both")
    if a.runtime_env_json:
        try:
            env = json.loads(a.runtime_env_json)
        except ValueError as e:
            sys.exit(f"serve: --runtime-env-json is not valid JSON: {e}")
    if not isinstance(env, dict):
        sys.exit("serve: the runtime_env must be a mapping")
    if a.working_dir:
        env["working_dir"] = a.working_dir
    return env


def cmd_deploy(a) -> int:
    cfg = _absolute_paths(_load_config(a.config_file),
                          os.path.dirname(os.path.abspath(a.config_file)))
    status, body = _rest("PUT", a.address, json.dumps(cfg).encode())
    if status != 200:
        sys.exit(f"serve: deploy failed ({status}): {body.decode(errors='replace')}")
    print("Sent deploy request successfully.")
    return 0


def _details(address) -> Dict[str, Any]:
    status, body = _rest("GET", address)
    if status != 200:
        sys.exit(f"serve: status failed ({status}): {body.decode(errors='replace')}")
    return json.loads(body or b"{}")


def cmd_status(a) -> int:
    import yaml
    d = _details(a.address)
    apps = {}
    for name, app in (d.get("applications") or {}).items():
        if a.name and name != a.name:
            continue
        apps[name] = {"status": app.get("status"), "message": app.get("message", ""),
                      "last_deployed_time_s": app.get("last_deployed_time_s"),
                      "deployments": {dn: {"status": dd.get("status"),
                                           "status_trigger": dd.get("status_trigger"),
                                           "replica_states": _count(dd.get("replicas") or []),
                                           "message": dd.get("message", "")}
                                      for dn, dd in (app.get("deployments") or {}).items()}}
    out = {"proxies": {n: p.get("status") for n, p in (d.get("proxies") or {}).items()},
           "applications": apps, "target_capacity": d.get("target_capacity")}
    print(yaml.safe_dump(out, sort_keys=False), end="")
    return 0


def _count(replicas) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for r in replicas:
        out[r.get("state")] = out.get(r.get("state"), 0) + 1
    return out


def cmd_config(a) -> int:
    import yaml
    d = _details(a.address)
    docs = [app.get("deployed_app_config") for n, app in (d.get("applications") or {}).items()
            if app.get("deployed_app_config") and (not a.name or n == a.name)]
    print("\n---\n\n".join(yaml.safe_dump(x, sort_keys=False) for x in docs), end="")
    return 0


def cmd_shutdown(a) -> int:
    if not a.yes:
        ans = input("This will shut down Serve on the cluster at "
                    f"{_dashboard(a.address)} and delete all applications. Continue? [y/N] ")
        if ans.strip().lower() not in ("y", "yes"):
            return 1
    status, body = _rest("DELETE", a.address)
    if status != 200:
        sys.exit(f"serve: shutdown failed ({status}): {body.decode(errors='replace')}")
    print("Sent shutdown request; applications will be deleted asynchronously.")
    return 0


def cmd_build(a) -> int:
    import yaml
    sys.path.insert(0, a.app_dir)
    from torus.serve._private.app_builder import load_application
    from torus.serve.deployment import build_app
    apps = []
    for i, target in enumerate(a.import_paths):
        app = load_application(target)
        deployments, _ = build_app(app, "app" + str(i + 1))
        entry = {"name": "app" + str(i + 1) if len(a.import_paths) > 1 else "default",
                 "route_prefix": "/" if len(a.import_paths) == 1 else f"/app{i + 1}",
                 "import_path": target, "runtime_env": {}, "deployments": []}
        for d in deployments:
            o = {"name": d.name}
            for k in ("num_replicas", "max_ongoing_requests", "user_config",
                      "autoscaling_config", "ray_actor_options"):
                if d.options.get(k) is not None:
                    v = d.options[k]
                    o[k] = v.model_dump() if hasattr(v, "model_dump") else v
            entry["deployments"].append(o)
        apps.append(entry)
    cfg = {"proxy_location": "EveryNode",
           "http_options": {"host": "0.0.0.0", "port": 8000}, "applications": apps}
    text = yaml.safe_dump(cfg, sort_keys=False)
    if a.output_path:
        Path(a.output_path).write_text(text)
    else:
        print(text, end="")
    return 0


def cmd_run(a) -> int:
    import torus
    from torus import serve
    sys.path.insert(0, a.app_dir)
    if a.address:
        os.environ["RAY_ADDRESS"] = a.address
    target = a.config_or_import_path
    env = _flag_runtime_env(a)
    if _local_working_dir(env) and a.app_dir == ".":
        sys.path.insert(0, os.path.abspath(env["working_dir"]))  # the app is imported here too
    torus.init(address=a.address or None, runtime_env=env or None)
    if target.endswith((".yaml", ".yml")):
        cfg = _absolute_paths(_load_config(target), os.path.dirname(os.path.abspath(target)))
        http = cfg.get("http_options") or {}
        if a.host or a.port:
            http = {**http, **({"host": a.host} if a.host else {}),
                    **({"port": a.port} if a.port else {})}
        serve.start(http_options={k: v for k, v in http.items()
                                  if k in ("host", "port", "request_timeout_s",
                                           "keep_alive_timeout_s", "root_path")} or None,
                    proxy_location=cfg.get("proxy_location"))
        from torus.serve._private.app_builder import build_from_config
        from torus.serve.api import _controller_or_raise, _wait_running
        from torus.serve.schema import ServeDeploySchema
        c = _controller_or_raise()
        from torus._private import runtime_env as _renv
        for app in ServeDeploySchema(**cfg).applications:
            app_cfg = app.model_dump(exclude_none=True)
            wd = _local_working_dir(app_cfg.get("runtime_env"))
            if wd and wd not in sys.path:
                sys.path.insert(0, wd)  # its import_path is imported here
            if app_cfg.get("runtime_env"):
                app_cfg["runtime_env"] = _renv.with_uris(app_cfg["runtime_env"],
                                                         f"application '{app.name}'")
            ingress, items = build_from_config(app_cfg)
            torus.get(c.deploy_application.remote(app.name, app.route_prefix, ingress, items,
                                                  app_cfg))
        for app in ServeDeploySchema(**cfg).applications:
            _wait_running(c, app.name)
    else:
        from torus.serve._private.app_builder import load_application
        http = {}
        if a.host:
            http["host"] = a.host
        if a.port:
            http["port"] = a.port
        serve.start(http_options=http or None)
        serve.run(load_application(target), name=a.name, route_prefix=a.route_prefix)
    print("Deployed app(s) successfully.", flush=True)
    if not a.blocking:
        return 0
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        print("Got KeyboardInterrupt, shutting down Serve...", flush=True)
        serve.shutdown()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="serve", description="Ray Serve's CLI on Torus.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run an application (module:app or a config file)")
    r.add_argument("config_or_import_path")
    r.add_argument("--address", "-a", default=None)
    r.add_argument("--host", default=None)
    r.add_argument("--port", type=int, default=None)
    r.add_argument("--name", default="default")
    r.add_argument("--route-prefix", default="/")
    r.add_argument("--app-dir", "-d", default=".")
    r.add_argument("--runtime-env", default=None, help="a YAML file holding a runtime_env")
    r.add_argument("--runtime-env-json", default=None)
    r.add_argument("--working-dir", default=None)
    r.add_argument("--blocking", dest="blocking", action="store_true", default=True)
    r.add_argument("--non-blocking", dest="blocking", action="store_false")
    r.set_defaults(fn=cmd_run)
    d = sub.add_parser("deploy", help="deploy a config file through the REST API")
    d.add_argument("config_file")
    d.add_argument("--address", "-a", default=None)
    d.set_defaults(fn=cmd_deploy)
    s = sub.add_parser("status", help="the status of Serve's applications")
    s.add_argument("--address", "-a", default=None)
    s.add_argument("--name", "-n", default=None)
    s.set_defaults(fn=cmd_status)
    c = sub.add_parser("config", help="the deployed applications' configs")
    c.add_argument("--address", "-a", default=None)
    c.add_argument("--name", "-n", default=None)
    c.set_defaults(fn=cmd_config)
    sd = sub.add_parser("shutdown", help="shut Serve down on the cluster")
    sd.add_argument("--address", "-a", default=None)
    sd.add_argument("--yes", "-y", action="store_true")
    sd.set_defaults(fn=cmd_shutdown)
    b = sub.add_parser("build", help="print a config file for applications")
    b.add_argument("import_paths", nargs="+")
    b.add_argument("--app-dir", "-d", default=".")
    b.add_argument("--output-path", "-o", default=None)
    b.set_defaults(fn=cmd_build)
    a = p.parse_args(argv)
    # Applications are Ray programs: `import ray` in them (and in what they start) is Torus.
    from torus._private import shim
    os.environ["TORUS_RAY_SHIM"] = "1"
    shim.install()
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
