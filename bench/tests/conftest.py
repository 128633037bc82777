"""Settings of keeper-bench's tests, as keeper's own (tests/conftest.py): Ray binds to loopback only, and no test
reaches the real home directory (HOME is a fresh temporary directory for the session; the workload's data and the
standard library's source need no download)."""

import atexit
import os
import shutil
import tempfile

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

TEST_HOME = tempfile.mkdtemp(prefix="keeper-bench-test-home-")
os.environ["HOME"] = TEST_HOME
atexit.register(shutil.rmtree, TEST_HOME, True)


@pytest.fixture(scope="module")
def local_ray(request):
    """Ray with 2 CPUs on loopback for the tests of one module, started once; the module's trainables, which
    Ray's workers cannot import, are shipped by value."""
    import ray

    ray.cloudpickle.register_pickle_by_value(request.module)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
