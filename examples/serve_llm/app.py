"""An OpenAI-compatible chat endpoint (`POST /v1/chat/completions`, streaming and not, and
`GET /v1/models`) served by a Ray Serve deployment whose replica spans the 4 hosts of one whole
v6e 4x4 slice: `placement_group_bundles=[{"TPU": 4}] * 4` reserves the slice atomically, one
rank per host; each rank joins one `jax.distributed` program and holds 1/16 of the weights
(model.py). Rank 0 takes the requests; Serve runs each call on every rank (SPMD).

Plain Ray Serve code: `python -m torus.ray examples/serve_llm/run.py` deploys and queries it.
On the simulated cluster of `torus up` each host's 4 chips are 4 CPU devices and the
collectives go over gloo.
"""
import json
import os
import time
import uuid
from typing import List, Optional

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from ray import serve

MODEL_NAME = "torus-tiny-byte-lm"
api = FastAPI()


class Message(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model: str = MODEL_NAME
    messages: List[Message]
    max_tokens: Optional[int] = 32
    temperature: Optional[float] = 0.0
    stream: bool = False
    seed: Optional[int] = 0


@serve.deployment(placement_group_bundles=[{"TPU": 4}] * 4,
                  ray_actor_options={"num_cpus": 0, "resources": {"TPU": 4}},
                  health_check_period_s=30, health_check_timeout_s=120)
@serve.ingress(api)
class ChatModel:
    def __init__(self, devices_per_host: int = 4):
        ctx = serve.get_replica_context()
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_host}"
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax
        import numpy as np
        from jax.sharding import Mesh
        import model

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], ctx.world_size,
                                   ctx.rank, initialization_timeout=300)
        self.mesh = Mesh(np.array(jax.devices()), ("model",))
        self.model = model.TinyLM(self.mesh)
        self.rank, self.world = ctx.rank, ctx.world_size
        self.host = f"{os.environ.get('TPU_NAME', '?')}/{os.environ.get('TPU_WORKER_ID', '?')}"
        list(self.model.generate(model.encode("warm up"), 1))  # compile once, before traffic

    @api.get("/v1/models")
    def models(self):
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model",
                                            "owned_by": "torus"}]}

    @api.get("/v1/slice")
    def where(self):
        return {"rank": self.rank, "world_size": self.world, "host": self.host,
                "devices": len(self.mesh.devices.flat)}

    @api.post("/v1/chat/completions")
    def chat(self, req: ChatRequest):
        import model
        prompt = "".join(f"{m.role}: {m.content}\n" for m in req.messages) + "assistant: "
        tokens = model.encode(prompt)
        n = max(1, min(req.max_tokens or 32, 64))
        gen = self.model.generate(tokens, n, req.temperature or 0.0, req.seed or 0)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if not req.stream:
            out = list(gen)
            return JSONResponse({
                "id": cid, "object": "chat.completion", "created": created,
                "model": MODEL_NAME,
                "choices": [{"index": 0, "message": {"role": "assistant",
                                                     "content": model.decode(out)},
                             "finish_reason": "length" if len(out) == n else "stop"}],
                "usage": {"prompt_tokens": len(tokens), "completion_tokens": len(out),
                          "total_tokens": len(tokens) + len(out)}})

        def events():
            def chunk(delta, finish=None):
                return "data: " + json.dumps({
                    "id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": MODEL_NAME,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"
            yield chunk({"role": "assistant", "content": ""})
            count = 0
            for tok in gen:
                count += 1
                yield chunk({"content": model.decode([tok])})
            yield chunk({}, "length" if count == n else "stop")
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


app = ChatModel.bind()
