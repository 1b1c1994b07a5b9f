"""Parts of the API that need no cluster: TPU arithmetic, option validation, the import shim,
exception types."""
import subprocess
import sys

import pytest

import torus
from torus import exceptions as exc
from torus.util import tpu
from torus.util.scheduling_strategies import (DoesNotExist, Exists, In,
                                              NodeLabelSchedulingStrategy, NotIn)


def test_tpu_versions_and_shapes():
    assert tpu.get_tpu_version_from_type("TPU-V6E") == "v6e"
    assert tpu.get_tpu_version_from_type("v5e") == "v5litepod"
    assert tpu.get_tpu_version_from_type("tpu7x") == "v7x"
    with pytest.raises(ValueError):
        tpu.get_tpu_version_from_type("v9z")
    assert tpu.get_chips_per_host("4x4", "v6e") == 4
    assert tpu.get_chips_per_host("2x4", "v6e") == 8
    assert tpu.get_num_chips_from_topology("2x2x4") == 16
    assert tpu.infer_tpu_pod_type_from_topology("4x4", "v6e") == "v6e-16"
    assert tpu.infer_tpu_pod_type_from_topology("2x2x2", "v4") == "v4-16"
    assert tpu.is_valid_topology("v4", "2x2x4") and not tpu.is_valid_topology("v4", "4x2x2")
    assert not tpu.is_valid_topology("v6e", "3x3")


def test_tpu_worker_resources():
    assert tpu.get_tpu_worker_resources("4x4", "TPU-V6E") == (4, {"CPU": 1, "TPU": 4})
    assert tpu.get_tpu_worker_resources("4x4", "v6e", {"TPU": 1}) == (16, {"CPU": 1, "TPU": 1})
    assert tpu.get_tpu_worker_resources("4x4", "v6e", num_slices=3)[0] == 12
    with pytest.raises(ValueError, match="not divisible"):
        tpu.get_tpu_worker_resources("4x4", "v6e", {"TPU": 3})
    assert tpu.get_tpu_num_slices_for_workers("4x4", "v6e", 9) == 3
    assert tpu.get_tpu_coordinator_env_vars("10.0.0.1", 2, 1) == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1", "MEGASCALE_PORT": "8081",
        "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1"}


def test_tpu_pod_env(monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    assert tpu.get_current_pod_name() is None and tpu.get_current_pod_worker_count() is None
    monkeypatch.setenv("TPU_NAME", "tpu-v6e-0")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "a,b,c,d")
    assert tpu.get_current_pod_name() == "tpu-v6e-0"
    assert tpu.get_current_pod_worker_count() == 4


def test_slice_placement_group_validates_before_reserving():
    with pytest.raises(ValueError, match="Invalid accelerator topology: '3x3'"):
        tpu.slice_placement_group(topology="3x3", accelerator_version="v6e")
    with pytest.raises(NotImplementedError, match="pg_per_slice"):
        tpu.slice_placement_group(topology="4x4", accelerator_version="v6e", pg_per_slice=True)


def test_option_validation_needs_no_cluster():
    @torus.remote
    def f():
        pass

    with pytest.raises(ValueError, match="Invalid option keyword"):
        f.options(bogus=1)
    with pytest.raises(ValueError):
        torus.remote(num_cpus=-1)(lambda: None)
    with pytest.raises(TypeError):
        f()
    with pytest.raises(ValueError):
        torus.remote(resources={"CPU": 1})(lambda: None)

    @torus.remote
    class A:
        async def m(self):
            pass

    with pytest.raises(TypeError):
        A()
    with pytest.raises(ValueError):
        A.options(lifetime="forever")


def test_label_strategy_to_selector():
    s = NodeLabelSchedulingStrategy(hard={"a": In("x"), "b": In("x", "y"), "c": NotIn("z"),
                                          "d": NotIn("p", "q"), "e": Exists(),
                                          "f": DoesNotExist()})
    assert s._to_selector() == {"a": "x", "b": "in(x,y)", "c": "!z", "d": "!in(p,q)",
                                "e": "exists()", "f": "!exists()"}
    with pytest.raises(ValueError):
        In()


def test_exception_hierarchy():
    assert issubclass(exc.GetTimeoutError, TimeoutError)
    assert issubclass(exc.ActorDiedError, exc.RayActorError)
    assert issubclass(exc.ObjectFetchTimedOutError, exc.ObjectLostError)
    for name in ("RayError", "RayTaskError", "GetTimeoutError", "ActorDiedError",
                 "RayActorError", "ObjectLostError", "WorkerCrashedError", "TaskCancelledError",
                 "RuntimeEnvSetupError", "OwnerDiedError", "ActorUnavailableError"):
        assert issubclass(getattr(exc, name), exc.RayError)


def test_shim_maps_ray_modules():
    code = (
        "from torus._private import shim; shim.install()\n"
        "import ray, torus, ray.util, ray.exceptions\n"
        "from ray.util.tpu import slice_placement_group, SlicePlacementGroup\n"
        "from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy\n"
        "from ray.util.placement_group import placement_group\n"
        "from ray.actor import exit_actor\n"
        "from ray.runtime_context import get_runtime_context\n"
        "from ray.util import ActorPool\n"
        "assert ray is torus and ray.util is torus.util\n"
        "try:\n"
        "    import ray.rllib\n"
        "except ModuleNotFoundError as e:\n"
        "    assert isinstance(e, NotImplementedError) and 'ray.rllib' in str(e)\n"
        "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stdout.strip() == "ok", p.stderr
