"""Long polling of the Serve controller: a value (a deployment's replica set, the route table)
and the callback that takes each new version of it.

One daemon thread per subscribed key: it calls `controller.listen_for_change(key, version)`,
which answers when the key's version passes `version` (or after the controller's poll timeout
with the same version), and hands a new value to the callback on that thread. A controller that
died is looked up again by name (it restarts, or `serve.start` makes a new one) with backoff.
`subscribe` returns once the first value has been delivered (or `first_timeout_s` passed), so a
new handle routes its first request without waiting for a poll round.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

logger = logging.getLogger("torus.serve")

CONTROLLER_NAME = "SERVE_CONTROLLER_ACTOR"
SERVE_NAMESPACE = "serve"


def get_controller(timeout_s: float = 0.0):
    """The running Serve controller's handle, or None."""
    import torus
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return torus.get_actor(CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        except ValueError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)


class LongPollClient:
    def __init__(self, key: str, callback: Callable[[Any], None]):
        self._key = key
        self._callback = callback
        self._version = None  # none yet: the controller answers at once
        self._first = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"serve-poll-{key}",
                                        daemon=True)
        self._thread.start()

    def wait_first(self, timeout_s: float) -> bool:
        return self._first.wait(timeout_s)

    def stop(self) -> None:
        self._stopped = True

    def _run(self) -> None:
        import torus
        from torus._private import worker
        backoff = 0.05
        controller = None
        while not self._stopped:
            if not worker.is_initialized():
                return
            try:
                if controller is None:
                    controller = get_controller()
                    if controller is None:
                        time.sleep(backoff)
                        backoff = min(backoff * 2, 1.0)
                        continue
                # With options: no per-handle cached call options, which this daemon thread's
                # frame would hold past the interpreter's end.
                version, value = torus.get(
                    controller.listen_for_change.options(name="serve.listen_for_change")
                    .remote(self._key, self._version))
                backoff = 0.05
                if version != self._version:
                    self._version = version
                    try:
                        self._callback(value)
                    except Exception:  # a callback's bug must not end the subscription
                        logger.exception("serve: long-poll callback for %s failed", self._key)
                    self._first.set()
            except Exception as e:
                if self._stopped or not worker.is_initialized():
                    return
                logger.debug("serve: long poll of %s failed (%s); retrying", self._key, e)
                controller = None
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
