#!/usr/bin/env python3
"""Writes an OCI image layout (https://github.com/opencontainers/image-spec, layout 1.0.0) of one
layer from a root filesystem tarball, with nothing but the standard library:

    scripts/oci_layout.py ROOTFS.tar OUT_DIR --ref torus:0.1.0 [--env K=V ...] [--cmd ARG ...]

OUT_DIR gets `oci-layout`, `index.json` (the manifest, tagged with the ref's tag) and
`blobs/sha256/` (the gzipped layer, the image config, the manifest). The layer is compressed
with a fixed gzip header time, so the same tarball gives the same digests. Any OCI tool reads
it, e.g. `skopeo copy oci:OUT_DIR:TAG docker-daemon:torus:TAG` or a push to a registry.
"""
import argparse
import gzip
import hashlib
import json
import os
import shutil
import sys


def _blob(out, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(out, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest


def _layer(out, rootfs_tar):
    """Gzips the tarball into a blob; returns (digest of the gzip, diff id of the tar, size)."""
    tmp = os.path.join(out, "blobs", "sha256", ".layer.tmp")
    tar_hash, gz_hash = hashlib.sha256(), hashlib.sha256()

    class Hashing:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            gz_hash.update(b)
            return self.f.write(b)

        def flush(self):
            self.f.flush()

    with open(rootfs_tar, "rb") as src, open(tmp, "wb") as raw:
        sink = Hashing(raw)
        with gzip.GzipFile(fileobj=sink, mode="wb", mtime=0, compresslevel=6) as gz:
            while chunk := src.read(1 << 20):
                tar_hash.update(chunk)
                gz.write(chunk)
    digest = gz_hash.hexdigest()
    os.replace(tmp, os.path.join(out, "blobs", "sha256", digest))
    return "sha256:" + digest, "sha256:" + tar_hash.hexdigest(), os.path.getsize(
        os.path.join(out, "blobs", "sha256", digest))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rootfs_tar")
    p.add_argument("out")
    p.add_argument("--ref", required=True, help="name:tag; the tag names the manifest in index.json")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--cmd", nargs="+", default=["/bin/bash"])
    p.add_argument("--workdir", default="/")
    a = p.parse_args(argv)
    if ":" not in a.ref:
        p.error("--ref must be name:tag, got " + repr(a.ref))
    if not os.path.isfile(a.rootfs_tar):
        p.error("no such tarball: " + a.rootfs_tar)
    for e in a.env:
        if "=" not in e:
            p.error("--env must be KEY=VALUE, got " + repr(e))
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(os.path.join(a.out, "blobs", "sha256"))
    layer_digest, diff_id, layer_size = _layer(a.out, a.rootfs_tar)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": a.env, "Cmd": a.cmd, "WorkingDir": a.workdir},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "scripts/image.sh (mmdebstrap rootfs, Torus wheel)"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = _blob(a.out, config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": layer_size}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = _blob(a.out, manifest_bytes)
    name, tag = a.ref.rsplit(":", 1)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": len(manifest_bytes),
                       "annotations": {"org.opencontainers.image.ref.name": tag,
                                       "io.containerd.image.name": f"{name}:{tag}"}}],
    }
    with open(os.path.join(a.out, "index.json"), "w") as f:
        json.dump(index, f, sort_keys=True)
    with open(os.path.join(a.out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    print(f"{a.out}: {a.ref} manifest {manifest_digest}, layer {layer_size / 2**20:.1f} MiB gzipped")


if __name__ == "__main__":
    main(sys.argv[1:])
