"""`python -m torus.serve._private.rest_bootstrap`: starts Serve on the cluster for a config
the head stored from `PUT /api/serve/applications/` (the head runs this as a job when no Serve
controller is alive). The controller reads the config from the head's KV store and applies it;
this process only starts it, with the config's HTTP options, and exits.
"""
import json
import sys


def main() -> int:
    import os
    from torus._private import shim
    os.environ["TORUS_RAY_SHIM"] = "1"  # and the workers it starts
    shim.install()  # user applications may `import ray`
    import torus
    from torus import serve
    from torus._private import worker
    torus.init(address="auto")
    raw = worker.core().kv_get("serve", "deploy_config")
    cfg = json.loads(bytes(raw).decode()) if raw else {}
    if cfg.get("_shutdown"):
        return 0
    http = dict(cfg.get("http_options") or {})
    http = {k: v for k, v in http.items() if k in ("host", "port", "root_path",
                                                   "request_timeout_s", "keep_alive_timeout_s")}
    serve.start(http_options=http or None, proxy_location=cfg.get("proxy_location"))
    print("Serve started; the controller applies the stored config.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
