"""FastAPI ingress (Ray Serve docs: "Set Up FastAPI and HTTP" → FastAPI HTTP deployments):
`@serve.ingress(app)` on a deployment class; `@app.get`/`@app.post` methods are routes under the
application's route_prefix, with path parameters, typed query parameters, a pydantic request
body and FastAPI's own validation (422) and 404s; instance state is shared by the routes; the
same routes answer through a DeploymentHandle's Python methods."""
import os
from typing import List, Optional

import ray
import requests
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"

app = FastAPI()


class Item(BaseModel):
    name: str
    price: float
    tags: List[str] = []


@serve.deployment
@serve.ingress(app)
class Store:
    def __init__(self, currency: str):
        self.currency = currency
        self.items = {}

    @app.get("/")
    def root(self):
        return {"store": "open", "currency": self.currency}

    @app.post("/items/{item_id}")
    def put_item(self, item_id: int, item: Item):
        self.items[item_id] = item
        return {"id": item_id, "name": item.name, "total": round(item.price * 2, 2),
                "tags": item.tags}

    @app.get("/items/{item_id}")
    def get_item(self, item_id: int, detail: bool = False, suffix: Optional[str] = None):
        if item_id not in self.items:
            raise HTTPException(status_code=404, detail=f"item {item_id} not found")
        item = self.items[item_id]
        out = {"id": item_id, "name": item.name + (suffix or "")}
        if detail:
            out["price"] = f"{item.price} {self.currency}"
        return out

    @app.get("/count")
    async def count(self) -> int:
        return len(self.items)


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(Store.bind("EUR"), name="store", route_prefix="/api")

    r = requests.get(f"{BASE}/api", timeout=30)
    assert r.status_code == 200 and r.json() == {"store": "open", "currency": "EUR"}, \
        (r.status_code, r.text)
    r = requests.get(f"{BASE}/api/", timeout=30)
    assert r.status_code == 200 and r.json()["store"] == "open", (r.status_code, r.text)

    r = requests.post(f"{BASE}/api/items/7",
                      json={"name": "lamp", "price": 12.5, "tags": ["home"]}, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.json() == {"id": 7, "name": "lamp", "total": 25.0, "tags": ["home"]}, r.json()

    r = requests.get(f"{BASE}/api/items/7", timeout=30)
    assert r.status_code == 200 and r.json() == {"id": 7, "name": "lamp"}, (r.status_code,
                                                                           r.text)
    r = requests.get(f"{BASE}/api/items/7", params={"detail": "true", "suffix": "!"},
                     timeout=30)
    assert r.json() == {"id": 7, "name": "lamp!", "price": "12.5 EUR"}, r.json()
    assert requests.get(f"{BASE}/api/count", timeout=30).json() == 1

    # FastAPI's own errors pass through the proxy unchanged.
    r = requests.get(f"{BASE}/api/items/8", timeout=30)
    assert r.status_code == 404 and r.json() == {"detail": "item 8 not found"}, (r.status_code,
                                                                                r.text)
    r = requests.get(f"{BASE}/api/items/notanint", timeout=30)
    assert r.status_code == 422, (r.status_code, r.text)
    r = requests.post(f"{BASE}/api/items/9", json={"name": "no price"}, timeout=30)
    assert r.status_code == 422, (r.status_code, r.text)
    r = requests.get(f"{BASE}/api/no/such/route", timeout=30)
    assert r.status_code == 404, (r.status_code, r.text)
    r = requests.delete(f"{BASE}/api/items/7", timeout=30)
    assert r.status_code == 405, (r.status_code, r.text)
    # Outside the prefix: Serve's 404.
    r = requests.get(f"{BASE}/items/7", timeout=30)
    assert r.status_code == 404, (r.status_code, r.text)

    # FastAPI serves its generated OpenAPI schema under the prefix too.
    r = requests.get(f"{BASE}/api/openapi.json", timeout=30)
    assert r.status_code == 200 and "/items/{item_id}" in r.json()["paths"], (r.status_code,
                                                                             r.text[:300])

    # The route methods are ordinary methods through a handle.
    h = serve.get_app_handle("store")
    assert h.count.remote().result(timeout_s=30) == 1
    assert h.root.remote().result(timeout_s=30) == {"store": "open", "currency": "EUR"}

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
