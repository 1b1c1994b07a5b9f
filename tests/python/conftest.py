"""Shared fixtures: one private local cluster (`torus.init()`) for the tests whose semantics
allow sharing; tests that need their own cluster start it themselves (helpers.Cluster)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

for _v in ("TORUS_ADDRESS", "RAY_ADDRESS", "TORUS_RAY_SHIM"):
    os.environ.pop(_v, None)
os.environ.setdefault("TORUS_TPU_METADATA_URL", "off")


@pytest.fixture(scope="session")
def torus_local():
    """A private local cluster in this process: 4 logical CPUs, a custom resource, labels."""
    import torus
    torus.init(num_cpus=4, resources={"custom": 2}, labels={"zone": "test-a"},
               namespace="pytest")
    yield torus
    torus.shutdown()
