"""A one-machine kubelet for the pods KubeRay's operator creates (tests/kuberay/conformance.py).

It does what GKE does to a pod and nothing more, so that the pod spec KubeRay wrote is what runs:
- **Network.** Each pod gets its own network namespace on a bridge, a new IP each time it is
  created, and an /etc/hosts in which every Service resolves to the pods it selects and every pod
  with `hostname`/`subdomain` to itself (cluster DNS: `<svc>`, `<svc>.<ns>.svc.cluster.local`,
  `<hostname>.<subdomain>...`). Files are rewritten in place, so running pods see new pods.
- **Container.** Its own mount, UTS and PID namespaces: hostname set, a private `/tmp`, a 64 MiB
  `/dev/shm` as the container runtime gives, then the pod's volumes at their mount paths
  (`emptyDir`, in memory as a sized tmpfs — KubeRay's /dev/shm; `persistentVolumeClaim`: one
  directory per claim that outlives pods; `hostPath`), the container's exact
  `command + args` with its environment resolved as the kubelet does (`value`, `fieldRef`,
  `resourceFieldRef`, `secretKeyRef`, `$(VAR)` expansion) over the image's PATH.
- **Init containers** run one after the other to exit 0 before the container starts.
- **Probes.** The exec probes of the container, run in the pod's namespaces.
- **TPU webhook** (GKE's, for a pod asking for `google.com/tpu`): hostname `G-r-j`, subdomain
  `<cluster>-headless`, and the TPU_* variables of ../shared/spec/tpu.md §5 (only unset ones). The
  simulated node has no TPU devices, so it also says how many chips it has (TORUS_TPU_CHIPS) and
  that there is no metadata server (TORUS_TPU_METADATA_URL=off): what a TPU VM's hardware says.

Needs root and iproute2. Not thread-safe: one caller drives it.
"""
import ipaddress
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

GKE_GENERATION = {"tpu-v4-podslice": "v4", "tpu-v5p-slice": "v5p", "tpu-v5-lite-podslice": "v5litepod",
                  "tpu-v5-lite-device": "v5litepod", "tpu-v6e-slice": "v6e", "tpu7x": "v7x"}


def quantity(q: str) -> float:
    """A Kubernetes quantity ("8Gi", "500m", "2") as a number."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(q).strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {q!r}")
    units = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
    if m.group(2) not in units:
        raise ValueError(f"unknown unit in quantity {q!r}")
    return float(m.group(1)) * units[m.group(2)]


def sh(*argv, check=True):
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


def pod_type(accelerator: str, topology: str, chips_per_host: int) -> str:
    """GKE's TPU_ACCELERATOR_TYPE: the generation and the slice's chips (v4/v5p count cores)."""
    gen = GKE_GENERATION[accelerator]
    chips = 1
    for d in topology.lower().split("x"):
        chips *= int(d)
    cores = chips * 2 if gen in ("v4", "v5p", "v7x") else chips
    return f"{gen}-{cores}"


def sweep(tag: str):
    for ns in sh("ip", "netns", "list").stdout.split():
        if ns.startswith(tag + "-"):
            sh("ip", "netns", "del", ns, check=False)
            sh("rm", "-rf", f"/etc/netns/{ns}", check=False)
    sh("ip", "link", "del", f"{tag}br", check=False)


class Pod:
    def __init__(self, obj: dict, ip: str, netns: str):
        self.obj, self.ip, self.netns = obj, ip, netns
        self.name = obj["metadata"]["name"]
        self.proc = None  # the container (unshare, whose child is the pod's PID 1)
        self.started = self.ready = None  # monotonic times

    @property
    def spec(self):
        return self.obj["spec"]

    @property
    def labels(self):
        return self.obj["metadata"].get("labels", {})

    def container(self):
        return self.spec["containers"][0]


class Kubelet:
    def __init__(self, workdir: Path, image_path: str, secrets: dict, cluster: str,
                 group_hosts: dict, namespace="default"):
        self.workdir = Path(workdir)
        self.group_hosts = group_hosts  # numOfHosts of each worker group
        self.slots: dict = {}  # TPU group -> {(replica, host): pod name}
        self.image_path = image_path  # PATH of the "image"
        self.secrets = secrets        # {"secret/key": value}
        self.cluster, self.namespace = cluster, namespace
        self.pods: dict[str, Pod] = {}
        self.services: list = []
        self.tag = f"k{os.getpid()}"  # names: k<pid>br, k<pid>v<n>, k<pid>-<n> (<= 15 chars)
        self.bridge = f"{self.tag}br"
        self.net = self._pick_subnet()
        self.next_host = 2
        self.count = 0
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)

    # ---- network ----
    def _pick_subnet(self):
        used = sh("ip", "-4", "-o", "addr").stdout
        for b in range(200, 250):
            net = ipaddress.ip_network(f"10.{b}.{os.getpid() % 250}.0/24")
            if str(net.network_address)[:-1] not in used:
                return net
        raise RuntimeError("no free 10.x.y.0/24 subnet")

    def setup(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.net.network_address + 1}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def teardown(self):
        for name in list(self.pods):
            try:
                self.kill(name)
            except Exception as e:  # keep tearing down the rest
                print(f"kubelet: removing pod {name}: {e}")
        sweep(self.tag)

    @staticmethod
    def sweep_stale():
        """Removes what a kubelet of a process that no longer runs left behind (a run stopped
        by SIGKILL): its namespaces, their /etc/netns entries and its bridge."""
        tags = {ns.split("-")[0] for ns in sh("ip", "netns", "list").stdout.split()
                if re.fullmatch(r"k\d+-\d+", ns)}
        tags |= {m for m in re.findall(r"\d+: (k\d+)br[:@]", sh("ip", "-o", "link").stdout)}
        for tag in tags:
            try:
                alive = "conformance.py" in Path(f"/proc/{tag[1:]}/cmdline").read_text()
            except OSError:
                alive = False
            if not alive:
                sweep(tag)

    def _netns(self, ip):
        self.count += 1
        ns = f"{self.tag}-{self.count}"
        veth = f"{self.tag}v{self.count}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", self.bridge, "up")
        for cmd in (["ip", "addr", "add", f"{ip}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                    ["ip", "link", "set", "lo", "up"],
                    ["ip", "route", "add", "default", "via", str(self.net.network_address + 1)]):
            sh("ip", "netns", "exec", ns, *cmd)
        Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{ns}/resolv.conf").write_text(
            f"search {self.namespace}.svc.cluster.local svc.cluster.local cluster.local\n")
        return ns

    def _hosts_table(self):
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        dom = f"{self.namespace}.svc.cluster.local"
        for p in self.pods.values():
            hn, sub = p.spec.get("hostname"), p.spec.get("subdomain")
            names = [f"{hn}.{sub}.{dom}", f"{hn}.{sub}", hn] if hn and sub else [hn or p.name]
            lines.append(f"{p.ip} {' '.join(names)}")
        for s in self.services:
            sel = s["spec"].get("selector") or {}
            ips = [p.ip for p in self.pods.values()
                   if sel and all(p.labels.get(k) == v for k, v in sel.items())]
            svc = s["metadata"]["name"]
            for ip in ips[:1]:  # /etc/hosts holds one answer per name
                lines.append(f"{ip} {svc}.{dom} {svc}.{self.namespace}.svc {svc}.{self.namespace} {svc}")
        return "\n".join(lines) + "\n"

    def _write_hosts(self):
        table = self._hosts_table()
        for p in self.pods.values():
            path = f"/etc/netns/{p.netns}/hosts"
            if not os.path.exists(path):
                open(path, "w").close()
            with open(path, "r+") as f:  # same inode (running pods see it), never empty
                f.write(table)
                f.truncate()

    # ---- the TPU webhook ----
    def _webhook(self, obj):
        """GKE's TPU webhook at admission: the pod takes the lowest free host slot (replica r,
        host j) of its group, so a recreated pod takes the slot of the one it replaces."""
        c = obj["spec"]["containers"][0]
        limits = c.get("resources", {}).get("limits", {}) or c.get("resources", {}).get("requests", {})
        if "google.com/tpu" not in limits:
            return
        group = obj["metadata"]["labels"]["ray.io/group"]
        sel = obj["spec"].get("nodeSelector", {})
        hosts = self.group_hosts.get(group, 1)
        taken = self.slots.setdefault(group, {})
        r, j = next((r, j) for r in range(1 << 20) for j in range(hosts) if (r, j) not in taken)
        taken[(r, j)] = obj["metadata"]["name"]
        chips = int(quantity(limits["google.com/tpu"]))
        sub = f"{self.cluster}-headless"[:63]
        obj["spec"]["hostname"] = f"{group}-{r}-{j}"
        obj["spec"]["subdomain"] = sub
        env = c.setdefault("env", [])
        have = {e["name"] for e in env}
        topology = sel["cloud.google.com/gke-tpu-topology"].lower()
        add = {"TPU_ACCELERATOR_TYPE": pod_type(sel["cloud.google.com/gke-tpu-accelerator"], topology, chips),
               "TPU_TOPOLOGY": topology, "TPU_NAME": f"{group}-{r}", "TPU_WORKER_ID": str(j),
               "TORUS_TPU_CHIPS": str(chips), "TORUS_TPU_METADATA_URL": "off"}
        if hosts > 1:
            add["TPU_WORKER_HOSTNAMES"] = ",".join(f"{group}-{r}-{h}.{sub}" for h in range(hosts))
        for k, v in add.items():
            if k not in have:
                env.append({"name": k, "value": v})

    # ---- pods ----
    def add_services(self, services):
        self.services = services

    def create(self, objs: list):
        """Admits new pods (webhook), gives them namespaces and starts their init containers and
        containers in the background."""
        new = []
        for o in objs:
            self._webhook(o)
            ip = str(self.net.network_address + self.next_host)
            self.next_host += 1
            p = Pod(o, ip, self._netns(ip))
            self.pods[p.name] = p
            new.append(p)
        self._write_hosts()
        for p in new:
            self._start(p)
        return new

    def _env(self, p: Pod, c: dict):
        limits = c.get("resources", {}).get("limits", {})
        requests = c.get("resources", {}).get("requests", {})
        hostname = p.spec.get("hostname") or p.name
        env = {"PATH": self.image_path, "HOSTNAME": hostname, "HOME": "/root"}
        for e in c.get("env", []):
            name = e["name"]
            if "value" in e:
                env[name] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                   lambda m: env.get(m.group(1), m.group(0)), e["value"])
                continue
            vf = e.get("valueFrom", {})
            if "fieldRef" in vf:
                env[name] = self._field(p, vf["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in vf:
                r = vf["resourceFieldRef"]
                res = r["resource"]
                kind, what = res.split(".", 1)
                q = (limits if kind == "limits" else requests).get(what)
                if q is None:  # unset: the node's allocatable, as Kubernetes does
                    q = str(os.cpu_count()) if what == "cpu" else str(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
                div = quantity(r.get("divisor", "1"))
                v = quantity(q) / div
                env[name] = str(int(-(-v // 1)))  # rounded up, as Kubernetes does
            elif "secretKeyRef" in vf:
                ref = vf["secretKeyRef"]
                k = f"{ref['name']}/{ref['key']}"
                if k not in self.secrets:
                    raise RuntimeError(f"pod {p.name}: secret {k} not given to the kubelet")
                env[name] = self.secrets[k]
            else:
                raise RuntimeError(f"pod {p.name}: env {name}: unsupported valueFrom {vf}")
        return env

    def _field(self, p: Pod, path: str):
        md = p.obj["metadata"]
        simple = {"metadata.name": p.name, "metadata.namespace": self.namespace,
                  "metadata.uid": md.get("uid", p.name), "status.podIP": p.ip, "status.hostIP": "10.0.0.1",
                  "spec.nodeName": "node-" + p.name, "spec.serviceAccountName": "default",
                  "status.podIPs": p.ip}
        if path in simple:
            return simple[path]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return md.get(m.group(1), {}).get(m.group(2), "")
        raise RuntimeError(f"pod {p.name}: unsupported fieldRef {path}")

    def _argv(self, c, env):
        expand = lambda s: re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                  lambda m: env.get(m.group(1), m.group(0)), s)
        argv = [expand(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        if not argv:
            raise RuntimeError("a container without a command: the image has no entry point")
        return argv

    def _mounts(self, p: Pod, c: dict) -> str:
        """Shell commands mounting the container's volumes (run inside its mount namespace)."""
        vols = {v["name"]: v for v in p.spec.get("volumes", [])}
        out = ""
        for m in c.get("volumeMounts", []):
            v, path = vols.get(m["name"]), m["mountPath"]
            if v is None:
                raise RuntimeError(f"pod {p.name}: volumeMount {m['name']} names no volume")
            if "emptyDir" in v and v["emptyDir"].get("medium") == "Memory":
                size = int(quantity(v["emptyDir"].get("sizeLimit", "1Gi")))
                q = shlex.quote(path)
                out += f"mkdir -p {q} && mount -t tmpfs -o size={size} tmpfs {q} && "
                continue
            if "emptyDir" in v:
                src = self.workdir / "pods" / p.name / "volumes" / m["name"]
            elif "persistentVolumeClaim" in v:
                src = self.workdir / "claims" / v["persistentVolumeClaim"]["claimName"]
            elif "hostPath" in v:
                src = Path(v["hostPath"]["path"])
            else:
                raise RuntimeError(f"pod {p.name}: volume {m['name']} of an unsupported kind: {v}")
            src.mkdir(parents=True, exist_ok=True)
            out += f"mkdir -p {shlex.quote(path)} && mount --bind {shlex.quote(str(src))} {shlex.quote(path)} && "
        return out

    def _in_pod(self, p: Pod, c: dict):
        """The command line that runs container `c` of `p` in its own namespaces."""
        env = self._env(p, c)
        argv = self._argv(c, env)
        root = self.workdir / "pods" / p.name
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        hostname = p.spec.get("hostname") or p.name
        # Keep what lives under /tmp (a CI clone, its virtualenv) visible under the pod's /tmp.
        keep = [d for d in {str(Path(self.image_path.split(":")[0]).resolve()), str(Path(__file__).resolve())}
                if d.startswith("/tmp/")]
        tops = {k.split("/")[2] for k in keep}
        q = lambda x: shlex.quote(str(x))  # noqa: E731
        binds = "".join(f"mkdir -p {q(root / 'tmp' / t)} && mount --bind {q('/tmp/' + t)} {q(root / 'tmp' / t)} && "
                        for t in tops)
        setup = (f"{binds}mount --rbind {q(root / 'tmp')} /tmp && "
                 f"mount -t tmpfs -o size=64m shm /dev/shm && {self._mounts(p, c)}hostname {q(hostname)} && "
                 'exec env -i "$@"')
        return (["ip", "netns", "exec", p.netns, "unshare", "--mount", "--uts", "--pid", "--fork",
                 "--kill-child", "--mount-proc", "--propagation", "private", "/bin/sh", "-c", setup, "sh"]
                + [f"{k}={v}" for k, v in env.items()] + argv)

    def _start(self, p: Pod):
        c = p.container()
        p.started = time.monotonic()
        log = open(self.workdir / "logs" / f"{p.name}.log", "ab")
        init = [self._in_pod(p, ic) for ic in p.spec.get("initContainers", [])]
        main = self._in_pod(p, c)
        # Init containers one after the other, then the container: a small supervisor in Python.
        # Open files as containerd allows them (KubeRay's command raises its limit to 65536),
        # where this machine lets root raise them.
        script = ("import subprocess,sys,json,resource\n"
                  "try: resource.setrlimit(resource.RLIMIT_NOFILE,(1048576,1048576))\n"
                  "except (ValueError, OSError): pass\n"
                  "steps=json.loads(sys.argv[1])\n"
                  "for s in steps[:-1]:\n"
                  "    r=subprocess.run(s)\n"
                  "    if r.returncode: sys.exit(100+r.returncode)\n"
                  "import os; os.execvp(steps[-1][0], steps[-1])\n")
        p.proc = subprocess.Popen(["python3", "-c", script, json.dumps(init + [main])],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def probe(self, p: Pod, which="readinessProbe") -> bool:
        pr = p.container().get(which)
        if not pr:
            return True
        if "exec" not in pr:
            raise RuntimeError(f"pod {p.name}: {which} is not an exec probe: {pr}")
        try:
            r = subprocess.run(["ip", "netns", "exec", p.netns, *pr["exec"]["command"]],
                               capture_output=True, timeout=max(5, pr.get("timeoutSeconds", 1) * 3))
        except subprocess.TimeoutExpired:
            return False  # a probe that times out fails, as the kubelet counts it
        return r.returncode == 0

    def wait_ready(self, pods, timeout: float):
        """Polls every pod's readiness probe every 0.5 s until all pass; sets Pod.ready."""
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in pods if p.ready is None]
            if not left:
                return
            for p in left:
                if p.proc.poll() is not None:
                    raise RuntimeError(f"pod {p.name} exited with {p.proc.returncode}; log:\n"
                                       + self.log(p.name)[-3000:])
                if self.probe(p):
                    p.ready = time.monotonic()
            if time.monotonic() > deadline:
                raise RuntimeError("not ready in time: " + ", ".join(p.name for p in left)
                                   + "\n" + "\n".join(f"--- {p.name}\n{self.log(p.name)[-1500:]}" for p in left))
            time.sleep(0.5)

    def exec(self, name: str, argv: list, timeout: float, extra_env=None):
        """Like `kubectl exec`: runs argv in the pod's namespaces with its container's env."""
        p = self.pods[name]
        # p.proc became `ip netns exec` and then unshare (each execs); its child is the pod's PID 1.
        target = sh("pgrep", "-P", str(p.proc.pid)).stdout.split()[0]
        env = self._env(p, p.container()) | (extra_env or {})
        cmd = ["nsenter", "-t", target, "-m", "-u", "-n", "-p", "env", "-i",
               *[f"{k}={v}" for k, v in env.items()], *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def kill(self, name: str):
        """The pod goes at once (SIGKILL to its PID namespace), its network with it."""
        p = self.pods.pop(name)
        for taken in self.slots.values():
            for slot in [s for s, n in taken.items() if n == name]:
                del taken[slot]
        if p.proc and p.proc.poll() is None:
            try:
                os.killpg(p.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.proc.wait()
        sh("ip", "netns", "del", p.netns, check=False)
        sh("rm", "-rf", f"/etc/netns/{p.netns}", check=False)
        self._write_hosts()

    def log(self, name):
        f = self.workdir / "logs" / f"{name}.log"
        return f.read_text(errors="replace") if f.exists() else ""
