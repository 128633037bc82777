"""Test session settings: Ray binds to loopback only, and no test reaches the real home directory or the user's
caches.

HOME points at a fresh temporary directory for the whole session (subprocesses and Ray workers inherit it), so
a zoo that falls back to ``~/.keeper/zoo`` lands there; caches of downloaded models keep their real place, so
tests that read them still find them offline. torch architecture exports are kept on disk in a directory of
this session, shared by every process the tests start.
"""

import atexit
import os
import shutil
import tempfile

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

REAL_HOME = os.path.expanduser("~")
for _var, _sub in (("HF_HOME", ".cache/huggingface"), ("TORCH_HOME", ".cache/torch")):
    if _var not in os.environ and os.path.isdir(os.path.join(REAL_HOME, _sub)):
        os.environ[_var] = os.path.join(REAL_HOME, _sub)
TEST_HOME = tempfile.mkdtemp(prefix="keeper-test-home-")
os.environ["HOME"] = TEST_HOME
os.environ["KEEPER_ARCH_CACHE"] = os.path.join(TEST_HOME, "keeper-arch-cache")
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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, saying why, where torch sees no CUDA device (torch is imported only when some
    collected test is marked so)."""
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"no CUDA device here (torch {torch.__version__}: torch.cuda.is_available() is "
                                   "False); `pytest -m gpu` and scripts/check_gpu.py run these on a GPU machine")
    for item in marked:
        item.add_marker(skip)
