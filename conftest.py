"""Test session settings of keeper's tests (tests/) and the benchmark workloads' (bench/tests/): Ray binds to
loopback only, and no test reaches the real home directory or the user's caches.

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
# Ray Train's placement-group cleaner asks Ray's state API, served by the dashboard, whether its controller lives;
# the tests' Rays run without a dashboard, so each query waited out its 10-s timeout against whichever cluster
# /tmp/ray last recorded, and every Ray Train run ended some 15 s after its workers did. A loopback port that
# refuses at once makes each query fail fast (the cleaner then keeps monitoring, as it does when the API is down).
os.environ.setdefault("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:1")
# Ray Train's controller polls its workers every 2 s by default: a run notices its workers' end sooner. Its
# preemption watcher, an actor process of its own per run, watches for spot-instance notices no test machine gets.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

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


@pytest.fixture
def service(request, tmp_path):
    """The keeper service settings of one test: a zoo in its ``tmp_path`` and a Ray namespace of its own, as the Tune
    tests pass to KeeperCallback and warm_start. The service the test started is shut down after it, so that its
    actor processes do not idle beside the next tests' trials until the module's Ray stops."""
    import uuid

    settings = {"zoo": str(tmp_path / "zoo"), "namespace": f"{request.module.__name__}-{uuid.uuid4().hex[:8]}"}
    yield settings
    import keeper.actors as ka

    ka.shutdown(settings)


def pytest_configure(config):
    """Under ``--dist loadfile``, xdist hands the modules out in the order :func:`pytest_collection_modifyitems`
    leaves them, not sorted by their number of tests (its default ``--loadscope-reorder``, which starts the many
    quick parametrized modules first and leaves a worker alone with a long Ray module at the end)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The modules run longest first, so that under ``-n 2 --dist loadfile`` (a module is one unit of work, handed
    to the next free worker in this order) the two workers end together: those that start Ray (marked ``ray``:
    Tune, PBT, the service, the examples) first, those with the most tests marked ``slow`` first among them, then
    the others with the most tests first. On two cores the suite is CPU-bound, Ray's own processes included, so a
    third worker does not shorten it (reports/NOTES.md, "What a Ray Train run costs keeper's tests").

    Tests marked ``gpu`` skip, saying why, where torch sees no CUDA device (torch is imported only when some
    collected test is marked so)."""
    ray, slow, count = set(), {}, {}
    for item in items:
        if item.get_closest_marker("ray") is not None:
            ray.add(item.path)
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
        count[item.path] = count.get(item.path, 0) + 1
    items.sort(key=lambda item: (item.path not in ray, -slow[item.path], -count[item.path]))  # stable within one
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
