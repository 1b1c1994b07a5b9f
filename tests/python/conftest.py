"""Shared fixtures: one private local cluster (`torus.init()`) for the tests whose semantics
allow sharing; tests that need their own cluster start it themselves (helpers.Cluster)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

for _v in ("TORUS_ADDRESS", "RAY_ADDRESS", "TORUS_RAY_SHIM"):
    os.environ.pop(_v, None)
os.environ.setdefault("TORUS_TPU_METADATA_URL", "off")
# A session root of our own: torus.init() without an address joins the latest session's
# cluster of the root, and another cluster on this machine must not be found.
if "TORUS_TMPDIR" not in os.environ or not os.environ.get("TORUS_PYTEST_KEEP_TMPDIR"):
    import tempfile
    os.environ["TORUS_TMPDIR"] = tempfile.mkdtemp(prefix="torus-pytest-root-")


@pytest.fixture(scope="session")
def torus_local():
    """A private local cluster in this process: 4 logical CPUs, a custom resource, labels."""
    import torus
    torus.init(address="local", num_cpus=4, resources={"custom": 2},
               labels={"zone": "test-a"}, namespace="pytest")
    yield torus
    torus.shutdown()
