#!/usr/bin/env bash
# The container image (scripts/image.sh), checked as a kubelet would use it: the OCI layout's
# blobs match their digests and the manifest names the layer and config; then the layer is
# unpacked and a head "pod" runs in it (own mount and PID namespaces, chrooted, /dev/shm a
# tmpfs as KubeRay mounts it) with KubeRay's own head command line, its health probes pass,
# and a Python program in the image runs tasks on it. Needs root (chroot, mounts).
#   tests/image_test.sh [OUT (build-image)]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "image_test: skipped: building the rootfs (mmdebstrap) and running a pod (chroot) need root"
  exit 0
fi
out="$(realpath -m "${1:-build-image}")"
[ -n "${TORUS_IMAGE_PREBUILT:-}" ] || scripts/image.sh "$out"

python3 - "$out/oci" <<'EOF'
import hashlib, json, os, sys
oci = sys.argv[1]
def blob(d):
    algo, h = d.split(":")
    p = os.path.join(oci, "blobs", algo, h)
    data = open(p, "rb").read() if os.path.getsize(p) < 1 << 20 else None
    digest = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == h, f"blob {d} does not match its digest"
    return data, os.path.getsize(p)
assert json.load(open(os.path.join(oci, "oci-layout")))["imageLayoutVersion"] == "1.0.0"
index = json.load(open(os.path.join(oci, "index.json")))
m = index["manifests"][0]
data, size = blob(m["digest"])
assert size == m["size"]
manifest = json.loads(data)
cdata, csize = blob(manifest["config"]["digest"])
assert csize == manifest["config"]["size"]
config = json.loads(cdata)
assert any(e.startswith("PATH=/usr/local/lib/torus/ray-compat:") for e in config["config"]["Env"]), config
for layer in manifest["layers"]:
    _, lsize = blob(layer["digest"])
    assert lsize == layer["size"] and layer["mediaType"].endswith("tar+gzip")
print("image_test: OCI layout", m["annotations"]["io.containerd.image.name"], "is consistent")
EOF

root=$(mktemp -d /tmp/torus-image-root.XXXXXX)
cleanup() { umount -R "$root" 2>/dev/null || true; rm -rf "$root"; }
trap cleanup EXIT
tar -xf "$out/rootfs.tar" -C "$root"
# What the kubelet mounts into every pod: its hosts file (localhost, the pod's name).
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
port=$(( 20000 + RANDOM % 20000 ))
dash=$(( port + 1 )) agent=$(( port + 2 ))
cat > "$root/pod.sh" <<EOF
#!/bin/bash
# KubeRay v1.5.0's head container command (ray-operator's generated ray start), on free ports.
ulimit -n 65536  # as KubeRay's command: a refused raise is reported and ignored
set -ex
# The head pod's address, as its Service resolves (the head binds it: docs/kuberay.md).
ip=\$(python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("8.8.8.8", 53)); print(s.getsockname()[0])')
ray start --head --block --port=$port --dashboard-agent-listen-port=$agent --dashboard-host=0.0.0.0 \
  --dashboard-port=$dash --memory=2000000000 --metrics-export-port=8080 --num-cpus=2 > /tmp/head.log 2>&1 &
head_pid=\$!
for i in \$(seq 150); do ray health-check --address \$ip:$port 2>/dev/null && break; sleep 0.2; done
ray health-check --address \$ip:$port
wget -T 2 -q -O- http://localhost:$agent/api/local_raylet_healthz | grep success
wget -T 2 -q -O- http://localhost:$dash/api/gcs_healthz | grep success
RAY_ADDRESS=\$ip:$port python3 - <<'PY'
import torus as ray
ray.init()
@ray.remote
def square(x):
    return x * x
print("SUM", sum(ray.get([square.remote(i) for i in range(10)])))
ray.shutdown()
PY
ray stop | grep "Stopped 1 Torus process"
wait \$head_pid  # the head's clean exit (0), as the kubelet's SIGTERM would end it
EOF
chmod +x "$root/pod.sh"
out_log=$(mktemp)
if ! unshare --mount --pid --fork bash -c "
    mount -t proc proc '$root/proc'
    mount -t tmpfs -o size=1g tmpfs '$root/dev/shm'
    chroot '$root' /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
      PATH=/usr/local/lib/torus/ray-compat:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      /pod.sh" > "$out_log" 2>&1; then
  cat "$out_log"; cat "$root/tmp/head.log" 2>/dev/null || true
  echo "image_test: the head pod did not come up or run work in the image" >&2
  exit 1
fi
cat "$out_log"
grep -q "SUM 285" "$out_log" || { echo "image_test: the program in the image printed no SUM 285" >&2; exit 1; }
echo "image_test: a head pod in the image passed KubeRay's probes and ran tasks"
