"""A small decoder-only transformer in plain JAX, its weights sharded over every device of a
multi-host slice, with a byte-level tokenizer of its own (nothing is downloaded).

`TinyLM(mesh)` builds random weights from a fixed seed (the same on every host) directly into
their shardings: the embedding and the attention/MLP matrices are split over the mesh's single
axis along their model dimension, so each host holds 1/N of them and XLA's SPMD partitioner
puts the collectives into the jitted step. Every process of the slice must call `generate`
with the same arguments at the same time (SPMD); each gets the same tokens back.
"""
from __future__ import annotations

from typing import Iterator, List

import numpy as np

VOCAB = 256 + 2  # bytes, BOS, EOS
BOS, EOS = 256, 257
D_MODEL, HEADS, LAYERS, FF, MAX_LEN = 128, 4, 2, 512, 96


def encode(text: str) -> List[int]:
    return [BOS] + list(text.encode("utf-8"))[-(MAX_LEN // 2):]


def decode(tokens: List[int]) -> str:
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


class TinyLM:
    def __init__(self, mesh):
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P

        self.jax, self.jnp = jax, jnp
        self.mesh = mesh
        axis = mesh.axis_names[0]
        col = NamedSharding(mesh, P(None, axis))   # split the output (model) dimension
        row = NamedSharding(mesh, P(axis, None))   # split the input dimension
        rep = NamedSharding(mesh, P())
        self.replicated = rep
        shapes = {"embed": ((VOCAB, D_MODEL), col), "unembed": ((D_MODEL, VOCAB), rep)}
        for i in range(LAYERS):
            shapes[f"qkv{i}"] = ((D_MODEL, 3 * D_MODEL), col)
            shapes[f"out{i}"] = ((D_MODEL, D_MODEL), row)
            shapes[f"ff1_{i}"] = ((D_MODEL, FF), col)
            shapes[f"ff2_{i}"] = ((FF, D_MODEL), row)
        names = sorted(shapes)

        def init(key):
            keys = jax.random.split(key, len(names))
            return {n: jax.random.normal(k, shapes[n][0], jnp.float32) / np.sqrt(shapes[n][0][0])
                    for n, k in zip(names, keys)}

        self.params = jax.jit(init, out_shardings={n: shapes[n][1] for n in names})(
            jax.random.PRNGKey(20261206))
        self.shardings = {n: shapes[n][1] for n in names}
        # Printable ASCII, newline and EOS may be sampled: random weights still give text.
        allowed = np.full((VOCAB,), -1e9, np.float32)
        allowed[32:127] = 0.0
        allowed[10] = 0.0
        allowed[EOS] = 0.0
        self._mask = allowed
        self._step = jax.jit(self._logits, in_shardings=(self.shardings, rep, rep),
                             out_shardings=rep)

    def _logits(self, params, tokens, length):
        jax, jnp = self.jax, self.jnp
        x = params["embed"][tokens]                          # (MAX_LEN, D)
        pos = jnp.arange(MAX_LEN)[:, None] / (10000 ** (jnp.arange(D_MODEL)[None, :] / D_MODEL))
        x = x + jnp.where(jnp.arange(D_MODEL) % 2 == 0, jnp.sin(pos), jnp.cos(pos))
        causal = jnp.tril(jnp.ones((MAX_LEN, MAX_LEN), bool))
        hd = D_MODEL // HEADS
        for i in range(LAYERS):
            h = _norm(jnp, x)
            q, k, v = jnp.split(h @ params[f"qkv{i}"], 3, axis=-1)
            q, k, v = (t.reshape(MAX_LEN, HEADS, hd).transpose(1, 0, 2) for t in (q, k, v))
            att = jnp.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(hd), -1e9)
            o = (jax.nn.softmax(att, axis=-1) @ v).transpose(1, 0, 2).reshape(MAX_LEN, D_MODEL)
            x = x + o @ params[f"out{i}"]
            h = _norm(jnp, x)
            x = x + jax.nn.gelu(h @ params[f"ff1_{i}"]) @ params[f"ff2_{i}"]
        last = _norm(jnp, x)[length - 1]
        return last @ params["unembed"]

    def generate(self, prompt: List[int], max_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> Iterator[int]:
        """Yields up to max_tokens new tokens (ends early at EOS or the context's end)."""
        jax = self.jax
        tokens = list(prompt)[:MAX_LEN - 1]
        rng = np.random.default_rng(seed)
        for _ in range(max_tokens):
            if len(tokens) >= MAX_LEN:
                return
            buf = np.zeros((MAX_LEN,), np.int32)
            buf[:len(tokens)] = tokens
            arr = jax.make_array_from_callback(buf.shape, self.replicated, lambda i: buf[i])
            n = jax.make_array_from_callback((), self.replicated,
                                             lambda i: np.int32(len(tokens)))
            logits = np.asarray(self._step(self.params, arr, n).addressable_data(0))
            logits = logits + self._mask
            if temperature > 0:
                p = np.exp((logits - logits.max()) / temperature)
                tok = int(rng.choice(VOCAB, p=p / p.sum()))
            else:
                tok = int(np.argmax(logits))
            if tok == EOS:
                return
            tokens.append(tok)
            yield tok


def _norm(jnp, x):
    return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)
