"""Deploys the OpenAI-compatible model of app.py on one whole v6e 4x4 slice and queries it with
the `openai` client, streaming and not; exits 1 if an answer is missing or malformed.

    python -m torus.ray examples/serve_llm/run.py [--port 8000]   # on a `torus up` cluster
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ray  # noqa: E402
import requests  # noqa: E402
from openai import OpenAI  # noqa: E402
from ray import serve  # noqa: E402

from app import MODEL_NAME, app  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args()
    ray.init()
    serve.start(http_options={"host": "127.0.0.1", "port": a.port})
    t = time.time()
    serve.run(app, name="llm", route_prefix="/")
    print(f"deployed on a whole slice in {time.time() - t:.1f} s", flush=True)
    base = f"http://127.0.0.1:{a.port}"
    where = requests.get(f"{base}/v1/slice", timeout=60).json()
    print(f"replica rank {where['rank']} of {where['world_size']} on {where['host']}, "
          f"{where['devices']} devices in its mesh", flush=True)
    client = OpenAI(base_url=f"{base}/v1", api_key="not-needed")
    ok = True
    t = time.time()
    r = client.chat.completions.create(model=MODEL_NAME, max_tokens=16, messages=[
        {"role": "user", "content": "Say something about TPU slices."}])
    text = r.choices[0].message.content
    print(f"chat.completions ({time.time() - t:.2f} s, {r.usage.completion_tokens} tokens): "
          f"{text!r}", flush=True)
    ok = ok and r.usage.completion_tokens > 0 and isinstance(text, str) and len(text) > 0
    t = time.time()
    pieces = []
    for chunk in client.chat.completions.create(model=MODEL_NAME, max_tokens=16, stream=True,
                                                messages=[{"role": "user",
                                                           "content": "Stream please."}]):
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            pieces.append(delta)
    print(f"streamed ({time.time() - t:.2f} s, {len(pieces)} chunks): {''.join(pieces)!r}",
          flush=True)
    ok = ok and len(pieces) > 1
    # The same prompt again, greedy: the same answer (every rank computed it together).
    again = client.chat.completions.create(model=MODEL_NAME, max_tokens=16, messages=[
        {"role": "user", "content": "Say something about TPU slices."}])
    ok = ok and again.choices[0].message.content == text
    serve.shutdown()
    print("OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
