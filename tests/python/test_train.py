"""JaxTrainer (torus.train, Ray Train v2's API) on a `torus up` cluster with one simulated v6e 4x4
slice (4 hosts x 4 chips): the JAX example trains data-parallel across the slice and matches a
single-process run; a host's worker killed mid-run restarts the group on a whole slice from the
last checkpoint; failure budgets, user exceptions, checkpoint pruning and restore."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, cluster_up, one_v6e_slice_manifest, run, run_python

EXAMPLE = REPO / "examples" / "jax_train" / "train_mlp.py"


def _has_jax() -> bool:
    try:
        import jax  # noqa: F401
        return True
    except ImportError:
        if os.environ.get("CI"):
            raise AssertionError("CPU JAX is missing from the test venv (scripts/test.sh "
                                 "installs it with scripts/jax_venv.sh)")
        return False


@pytest.fixture(scope="module")
def v6e(tmp_path_factory):
    with cluster_up(one_v6e_slice_manifest(tmp_path_factory.mktemp("manifest"))) as c:
        yield c


def _single_losses(steps):
    p = run([sys.executable, str(EXAMPLE), "--single", "--steps", str(steps)], timeout=300)
    return json.loads(p.stdout.split("SINGLE ", 1)[1])


def _result(stdout):
    line = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, stdout
    return json.loads(line[0][len("RESULT "):])


def _losses(stdout):
    out = {}
    for ln in stdout.splitlines():
        if "] report " in ln and "loss=" in ln:
            step = int(ln.split("step=")[1].split(",")[0])
            out[step] = float(ln.split("loss=")[1].split(",")[0])
    return out


def test_example_trains_across_the_slice_and_matches_one_process(v6e, tmp_path):
    if not _has_jax():
        pytest.skip("no CPU JAX here (scripts/jax_venv.sh .venv-py)")
    steps = 20
    p = run([sys.executable, "-m", "torus.ray", str(EXAMPLE), "--steps", str(steps),
             "--storage", str(tmp_path), "--name", "plain", "--num-to-keep", "1"],
            env=v6e.driver_env(), timeout=600)
    res = _result(p.stdout)
    losses = _losses(p.stdout)
    assert sorted(losses) == list(range(steps)), p.stdout     # one progress line per report
    assert res["metrics"]["devices"] == 8                     # 4 hosts x 2 devices, one program
    assert losses[steps - 1] < losses[0] / 3                  # it learns
    single = _single_losses(steps)
    for s in range(steps):
        assert losses[s] == pytest.approx(single[s], rel=1e-4), (s, losses[s], single[s])
    # num_to_keep=1: only the final checkpoint is left, and it is the result's.
    kept = sorted(d.name for d in (tmp_path / "plain").iterdir() if d.name.startswith("checkpoint_"))
    assert kept == [Path(res["checkpoint"]).name] and (Path(res["checkpoint"]) / "params.npz").exists()
    assert "(checkpoint: " in p.stdout


def test_a_killed_host_worker_restarts_the_group_from_the_last_checkpoint(v6e, tmp_path):
    if not _has_jax():
        pytest.skip("no CPU JAX here (scripts/jax_venv.sh .venv-py)")
    steps = 30
    pids = tmp_path / "pids"
    pids.mkdir()
    cmd = [sys.executable, "-m", "torus.ray", str(EXAMPLE), "--steps", str(steps),
           "--storage", str(tmp_path), "--name", "killed", "--step-sleep", "0.3",
           "--pid-dir", str(pids), "--checkpoint-every", "10"]
    proc = subprocess.Popen(cmd, env=v6e.driver_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    killed = False
    deadline = time.monotonic() + 600
    for ln in proc.stdout:
        lines.append(ln)
        # Past the first checkpoint (step 9), mid-way to the next: SIGKILL rank 2's process.
        if not killed and "step=12," in ln:
            os.kill(int((pids / "rank2.pid").read_text()), 9)
            killed = True
        assert time.monotonic() < deadline, "".join(lines)
    assert proc.wait(timeout=60) == 0, "".join(lines)
    out = "".join(lines)
    assert killed, out
    restart = [i for i, ln in enumerate(lines) if "restart 1 of 2 from" in ln]
    assert len(restart) == 1 and lines[restart[0]].rstrip().endswith("checkpoint_000009"), out
    after = [ln for ln in lines[restart[0]:] if "] report " in ln]
    assert after and "step=10," in after[0], out   # resumed after step 9's checkpoint
    assert sorted(_losses("".join(after))) == list(range(10, steps))
    res = _result(out)
    assert res["metrics"]["step"] == steps - 1
    single = _single_losses(steps)
    # Resumed from step 9's parameters: the same trajectory as an uninterrupted run.
    assert res["metrics"]["loss"] == pytest.approx(single[-1], rel=1e-4), (res, single[-1])


LOOPS = '''
import json, os, sys, time
import ray
from ray import train
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.jax import JaxTrainer

STORAGE = sys.argv[1]
SC = ScalingConfig(use_tpu=True, topology="4x4", accelerator_type="TPU-V6E", num_workers=4)
'''


def _run_loops(v6e, tmp_path, body, check=True):
    return run_python(LOOPS + body, env=v6e.driver_env(), shim=True, timeout=600,
                      args=(str(tmp_path),), check=check)


def test_context_and_failures_and_user_tracebacks(v6e, tmp_path):
    p = _run_loops(v6e, tmp_path, '''
import tempfile
def where(config):
    ctx = train.get_context()
    with tempfile.TemporaryDirectory() as d:
        train.report({"rank": ctx.get_world_rank(), "world": ctx.get_world_size(),
                      "local": ctx.get_local_rank(), "node_rank": ctx.get_node_rank(),
                      "name": ctx.get_experiment_name(),
                      "tpu_worker": os.environ.get("TPU_WORKER_ID"),
                      "coord": os.environ.get("JAX_COORDINATOR_ADDRESS")},
                     checkpoint=Checkpoint.from_directory(d))
    with open(os.path.join(STORAGE, f"ctx{ctx.get_world_rank()}.json"), "w") as f:
        json.dump({"node": ray.get_runtime_context().get_node_id(),
                   "node_rank": ctx.get_node_rank(), "local": ctx.get_local_rank(),
                   "tpu_worker": os.environ.get("TPU_WORKER_ID")}, f)
r = JaxTrainer(where, scaling_config=SC, run_config=RunConfig(name="ctx", storage_path=STORAGE)).fit()
print("CTX", json.dumps(r.metrics))

def bad(config):
    if train.get_context().get_world_rank() == 0:
        raise ValueError("bad batch at step 3")
    time.sleep(30)
try:
    JaxTrainer(bad, scaling_config=SC, run_config=RunConfig(name="bad", storage_path=STORAGE)).fit()
    print("NO ERROR")
except train.TrainingFailedError as e:
    import traceback
    print("USERERR", json.dumps({"msg": str(e), "cause": "".join(
        traceback.format_exception(e.__cause__))}))

def die(config):
    ctx = train.get_context()
    with open(os.path.join(STORAGE, f"attempt{ctx.get_attempt()}-{ctx.get_world_rank()}"), "w"):
        pass
    if ctx.get_world_rank() == 1:
        os._exit(3)
    time.sleep(60)
t0 = time.monotonic()
try:
    JaxTrainer(die, scaling_config=SC, run_config=RunConfig(
        name="die", storage_path=STORAGE, failure_config=FailureConfig(max_failures=1))).fit()
    print("NO ERROR")
except train.TrainingFailedError as e:
    print("DIED", json.dumps({"msg": str(e), "s": time.monotonic() - t0,
                              "ranks": sorted(e.worker_failures)}))
# Nothing is held after the failure: the slice's 16 chips are free again.
deadline = time.monotonic() + 30
while ray.available_resources().get("TPU", 0) < 16 and time.monotonic() < deadline:
    time.sleep(0.2)
print("FREE", ray.available_resources().get("TPU", 0))

# An ordinary group (no TPU): two workers of one CPU each, the config passed.
def plain(config):
    ctx = train.get_context()
    train.report({"rank": ctx.get_world_rank(), "x": config["x"]})   # no checkpoint
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, f"rank{ctx.get_world_rank()}"), "w").close()
        train.report({"rank": ctx.get_world_rank(), "world": ctx.get_world_size()},
                     checkpoint=Checkpoint.from_directory(d))
r = JaxTrainer(plain, train_loop_config={"x": 7}, scaling_config=ScalingConfig(num_workers=2),
               run_config=RunConfig(name="plain", storage_path=STORAGE)).fit()
print("PLAIN", json.dumps({"metrics": r.metrics, "files": sorted(os.listdir(r.checkpoint.path))}))
''')
    ctx = json.loads(p.stdout.split("CTX ", 1)[1].splitlines()[0])
    assert ctx["world"] == 4 and ctx["rank"] == 0 and ctx["name"] == "ctx"
    assert ctx["tpu_worker"] == "0" and ctx["coord"] and ":" in ctx["coord"]
    per_rank = [json.loads((tmp_path / f"ctx{r}.json").read_text()) for r in range(4)]
    assert len({c["node"] for c in per_rank}) == 4                 # one worker per host
    assert sorted(c["node_rank"] for c in per_rank) == [0, 1, 2, 3]
    assert all(c["local"] == 0 for c in per_rank)
    assert sorted(c["tpu_worker"] for c in per_rank) == ["0", "1", "2", "3"]  # the whole slice
    err = json.loads(p.stdout.split("USERERR ", 1)[1].splitlines()[0])
    assert "ValueError: bad batch at step 3" in err["msg"]
    assert "bad batch at step 3" in err["cause"] and "in bad" in err["cause"], err["cause"]
    died = json.loads(p.stdout.split("DIED ", 1)[1].splitlines()[0])
    assert "failed 2 time(s)" in died["msg"] and "max_failures=1" in died["msg"], died
    assert "ActorDied" in died["msg"] or "died" in died["msg"].lower(), died
    assert died["ranks"] == [1]
    attempts = sorted(f.name for f in tmp_path.iterdir() if f.name.startswith("attempt"))
    assert [a for a in attempts if a.endswith("-1")] == ["attempt0-1", "attempt1-1"]
    assert float(p.stdout.split("FREE ", 1)[1].split()[0]) == 16
    plain = json.loads(p.stdout.split("PLAIN ", 1)[1].splitlines()[0])
    # As Ray: the result's metrics are rank 0's of the latest checkpoint; every rank's files.
    assert plain == {"metrics": {"rank": 0, "world": 2}, "files": ["rank0", "rank1"]}


def test_checkpoints_pruned_and_a_run_restored(v6e, tmp_path):
    p = _run_loops(v6e, tmp_path, '''
import tempfile
def loop(config):
    ckpt = train.get_checkpoint()
    start = 0
    if ckpt:
        with ckpt.as_directory() as d:
            start = json.load(open(os.path.join(d, "s.json")))["step"] + 1
    for s in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            if train.get_context().get_world_rank() == 0:
                json.dump({"step": s}, open(os.path.join(d, "s.json"), "w"))
                train.report({"step": s, "start": start}, checkpoint=Checkpoint.from_directory(d))
            else:
                train.report({"step": s, "start": start})
rc = RunConfig(name="keep", storage_path=STORAGE, checkpoint_config=CheckpointConfig(num_to_keep=2))
r = JaxTrainer(loop, train_loop_config={"steps": 5}, scaling_config=SC, run_config=rc).fit()
print("FIRST", json.dumps({"metrics": r.metrics, "ckpt": r.checkpoint.path,
                           "best": [c.path for c, _ in r.best_checkpoints]}))
# The run resumed from its path with more steps: it starts after the last checkpoint.
t = JaxTrainer.restore(os.path.join(STORAGE, "keep"), train_loop_config={"steps": 8})
r2 = t.fit()
print("SECOND", json.dumps({"metrics": r2.metrics, "ckpt": r2.checkpoint.path}))
''')
    first = json.loads(p.stdout.split("FIRST ", 1)[1].splitlines()[0])
    assert first["metrics"] == {"step": 4, "start": 0}
    assert [Path(x).name for x in first["best"]] == ["checkpoint_000003", "checkpoint_000004"]
    second = json.loads(p.stdout.split("SECOND ", 1)[1].splitlines()[0])
    assert second["metrics"] == {"step": 7, "start": 5}
    kept = sorted(d.name for d in (tmp_path / "keep").iterdir() if d.name.startswith("checkpoint_"))
    assert kept == ["checkpoint_000006", "checkpoint_000007"]
    assert Path(second["ckpt"]).name == "checkpoint_000007"


def test_two_slices_make_one_group_with_multislice_coordination(tmp_path):
    # The example manifest with two v6e 4x4 slices (8 hosts) and the head.
    text = (REPO / "examples" / "clusters" / "v6e-4x4-3-slices.yaml").read_text()
    manifest = tmp_path / "two-slices.yaml"
    manifest.write_text(text.replace("replicas: 3", "replicas: 2").replace("maxReplicas: 3",
                                                                           "maxReplicas: 2"))
    with cluster_up(str(manifest)) as c:
        p = run_python(LOOPS.replace("num_workers=4", "num_workers=8") + '''
def where(config):
    ctx = train.get_context()
    keys = ("TPU_NAME", "TPU_WORKER_ID", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
            "MEGASCALE_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
    with open(os.path.join(STORAGE, f"rank{ctx.get_world_rank()}.json"), "w") as f:
        json.dump(dict({k: os.environ.get(k) for k in keys},
                       node=ray.get_runtime_context().get_node_id()), f)
r = JaxTrainer(where, scaling_config=SC, run_config=RunConfig(name="two", storage_path=STORAGE)).fit()
print("DONE", r.error)
''', env=c.driver_env(), shim=True, timeout=600, args=(str(tmp_path),))
        assert "DONE None" in p.stdout, p.stdout
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(8)]
    assert len({x["node"] for x in ranks}) == 8                      # one worker per host
    slices = [x["TPU_NAME"] for x in ranks]
    assert len(set(slices[:4])) == 1 and len(set(slices[4:])) == 1 and slices[0] != slices[4]
    assert [x["TPU_WORKER_ID"] for x in ranks] == [str(r % 4) for r in range(8)]
    assert [x["MEGASCALE_SLICE_ID"] for x in ranks] == [str(r // 4) for r in range(8)]
    assert {x["MEGASCALE_NUM_SLICES"] for x in ranks} == {"2"}
    coord_ip = ranks[0]["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[0]
    assert {x["MEGASCALE_COORDINATOR_ADDRESS"] for x in ranks} == {coord_ip}
