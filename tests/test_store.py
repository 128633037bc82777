"""Tests of keeper.store: a local directory, a SIGKILLed writer, and S3 on a loopback moto server."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from s3server import free_port, running

from keeper.errors import AdmissionError, CorruptModelError, ModelNotFoundError, StoreError, ZooNotFoundError
from keeper.store import ModelRecord, ModelStore
from keeper.store.files import _HOST, STALE_TEMP_S

REPO = Path(__file__).resolve().parents[1]


def put(store: ModelStore, name: str, blob: bytes, **kw):
    kw.setdefault("accuracy", 0.9)
    kw.setdefault("num_params", 10)
    kw.setdefault("summary", {"nodes": 3})
    return store.put(name, blob, **kw)


def blob_file(root: Path, rec: ModelRecord) -> Path:
    return root / "blobs" / f"{rec.checksum}.onnx"


def files(root: Path, sub: str) -> set[str]:
    d = root / sub
    return {p.name for p in d.iterdir()} if d.exists() else set()


class Flaky:
    """A filesystem proxy whose named methods fail ``failures`` times (then behave), or call ``before``."""

    def __init__(self, fs, methods, failures=10**9, before=None, error=None):
        self.fs, self.methods, self.failures, self.before = fs, set(methods), failures, before
        self.error = error
        self.calls = 0

    def __getattr__(self, attr):
        real = getattr(self.fs, attr)
        if attr not in self.methods:
            return real

        def call(*a, **k):
            self.calls += 1
            if self.before is not None:
                self.before(attr, a)
            elif self.failures > 0:
                self.failures -= 1
                raise self.error or OSError(f"injected fault in {attr}")
            return real(*a, **k)
        return call


# -- local directory
def test_put_get_records_roundtrip(tmp_path):
    store = ModelStore(str(tmp_path))
    rec, created = put(store, "b-model", b"onnx-b", accuracy=0.8, num_params=7, summary={"nodes": 2, "sig": [1, 2]},
                       extras={"graph.npz": b"graph-b"})
    put(store, "a_model", b"onnx-a")
    assert created and rec.name == "b-model" and rec.accuracy == 0.8 and rec.num_params == 7 and rec.hits == 0.0
    assert rec.nbytes == 6 and rec.extras == ("graph.npz",) and rec.summary == {"nodes": 2, "sig": [1, 2]}
    assert store.get("b-model") == b"onnx-b" and store.get_extra("b-model", "graph.npz") == b"graph-b"
    assert [r.name for r in store.records()] == ["a_model", "b-model"] == [r.name for r in store]
    assert len(store) == 2 and "a_model" in store and "zz" not in store and 3 not in store
    assert store.record("b-model") == rec and store.uri == str(tmp_path)
    with pytest.raises(ModelNotFoundError, match="'nope'"):
        store.record("nope")
    with pytest.raises(ModelNotFoundError, match="no extra 'x.bin'"):
        store.get_extra("b-model", "x.bin")
    entry = (tmp_path / "catalog" / "b-model.json").read_text()
    assert entry == json.dumps(json.loads(entry), sort_keys=True, indent=1)  # deterministic
    assert ModelRecord.from_json(json.loads(entry)) == rec


def test_reput_same_content_is_idempotent(tmp_path):
    store = ModelStore(tmp_path)
    rec, _ = put(store, "m", b"same", extras={"graph.npz": b"g"})
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    again, created = put(store, "m", b"same", accuracy=0.1, extras={"graph.npz": b"other"})
    assert not created and again == rec
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before


def test_name_taken_by_other_content(tmp_path):
    store = ModelStore(tmp_path)
    put(store, "m", b"one")
    with pytest.raises(AdmissionError, match=r"'m' is taken.*another name or remove"):
        put(store, "m", b"two")
    assert store.get("m") == b"one"


@pytest.mark.parametrize("bad", ["", ".hidden", "..", "a/b", "a\\b", "sp ace", "ü", "x" * 129, None, 3])
def test_bad_names_refused(tmp_path, bad):
    store = ModelStore(tmp_path)
    with pytest.raises(AdmissionError, match="not allowed: use 1 to 128"):
        put(store, bad, b"x")
    with pytest.raises(AdmissionError, match="extra name"):
        put(store, "ok", b"x", extras={bad if bad else "../x": b"y"})
    assert len(store) == 0 and files(tmp_path, "catalog") == set()


def test_bad_fields_refused(tmp_path):
    store = ModelStore(tmp_path)
    for kw in ({"accuracy": float("nan")}, {"num_params": -1}, {"summary": {"f": object()}}):
        with pytest.raises(AdmissionError, match="'m'"):
            put(store, "m", b"x", **kw)
    with pytest.raises(AdmissionError, match="non-empty bytes"):
        put(store, "m", b"")
    assert len(store) == 0


def test_update_rewrites_mutable_fields(tmp_path):
    store = ModelStore(tmp_path)
    rec, _ = put(store, "m", b"x")
    new = store.update("m", hits=2.5, accuracy=0.95, summary={"hit_time": 1.0})
    assert (new.hits, new.accuracy, new.summary) == (2.5, 0.95, {"hit_time": 1.0})
    assert new.checksum == rec.checksum and store.record("m") == new
    assert ModelStore(tmp_path).record("m") == new
    with pytest.raises(AdmissionError, match="cannot be updated"):
        store.update("m", checksum="0" * 64)
    with pytest.raises(ModelNotFoundError):
        store.update("absent", hits=1.0)
    assert files(tmp_path, "tmp") == set()


def test_replace_extra_commits_last_and_loses_nothing(tmp_path):
    store = ModelStore(tmp_path)
    rec, _ = put(store, "m", b"model", extras={"graph.npz": b"old-graph"})
    store._files.fs = Flaky(store._files.fs, {"move"})  # the new blob cannot be stored: the record keeps the old extra
    with pytest.raises(StoreError):
        store.replace_extra("m", "graph.npz", b"new-graph")
    store._files.fs = store._files.fs.fs
    assert ModelStore(tmp_path).get_extra("m", "graph.npz") == b"old-graph"
    new = store.replace_extra("m", "graph.npz", b"new-graph")
    assert new.extra_checksums["graph.npz"] != rec.extra_checksums["graph.npz"]
    assert (new.checksum, new.accuracy, new.created) == (rec.checksum, rec.accuracy, rec.created)
    reopened = ModelStore(tmp_path)
    assert reopened.get_extra("m", "graph.npz") == b"new-graph" and reopened.get("m") == b"model"
    assert store.replace_extra("m", "graph.npz", b"new-graph") == new  # same bytes: nothing written
    assert store.gc() == 1  # the old extra, referenced by nothing now
    with pytest.raises(ModelNotFoundError, match="no extra"):
        store.replace_extra("m", "weights.bin", b"w")
    with pytest.raises(ModelNotFoundError, match="nothing to replace"):
        store.replace_extra("absent", "graph.npz", b"g")
    with pytest.raises(AdmissionError, match="non-empty"):
        store.replace_extra("m", "graph.npz", b"")


def test_remove_keeps_shared_blobs(tmp_path):
    store = ModelStore(tmp_path)
    a, _ = put(store, "a", b"model-a", extras={"graph.npz": b"same-arch"})
    b, _ = put(store, "b", b"model-b", extras={"graph.npz": b"same-arch"})
    assert len(files(tmp_path, "blobs")) == 3  # the shared extra is stored once
    store.remove("a")
    assert "a" not in store and not blob_file(tmp_path, a).exists()
    assert store.get_extra("b", "graph.npz") == b"same-arch" and store.get("b") == b"model-b"
    with pytest.raises(ModelNotFoundError):
        store.remove("a")
    store.remove("b")
    assert files(tmp_path, "blobs") == set() and files(tmp_path, "catalog") == set() and len(store) == 0


def test_corruption_detected(tmp_path):
    store = ModelStore(tmp_path)
    rec, _ = put(store, "m", b"model-bytes", extras={"graph.npz": b"graph-bytes"})
    path = blob_file(tmp_path, rec)
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptModelError, match=r"model 'm'.*remove the model and register it again"):
        store.get("m")
    extra = tmp_path / "blobs" / f"{rec.extra_checksums['graph.npz']}.graph.npz"
    extra.write_bytes(b"graph-bytez")
    with pytest.raises(CorruptModelError, match="extra 'graph.npz'"):
        store.get_extra("m", "graph.npz")
    path.unlink()
    with pytest.raises(CorruptModelError, match="missing"):
        store.get("m")


def test_reopen_restores_everything(tmp_path):
    store = ModelStore(f"file://{tmp_path}")
    for i in range(5):
        put(store, f"m{i}", f"blob{i}".encode(), accuracy=i / 10, extras={"graph.npz": bytes([i])})
    store.update("m2", hits=3.0)
    again = ModelStore(str(tmp_path))
    assert again.records() == store.records()
    assert [again.get(f"m{i}") for i in range(5)] == [f"blob{i}".encode() for i in range(5)]


def test_unreadable_catalog_entries_are_skipped(tmp_path, caplog):
    store = ModelStore(tmp_path)
    put(store, "good", b"x")
    (tmp_path / "catalog" / "garbage.json").write_text("{not json")
    (tmp_path / "catalog" / "half.json").write_text((tmp_path / "catalog" / "good.json").read_text()[:40])
    (tmp_path / "catalog" / "liar.json").write_text((tmp_path / "catalog" / "good.json").read_text())
    (tmp_path / "catalog" / "listish.json").write_text("[1, 2]")
    with caplog.at_level(logging.WARNING, logger="keeper.store"):
        again = ModelStore(tmp_path)
    assert [r.name for r in again.records()] == ["good"]
    assert sum("skipping" in r.message for r in caplog.records) == 4


def test_gc_removes_orphans_and_temp_files(tmp_path):
    store = ModelStore(tmp_path)
    rec, _ = put(store, "m", b"kept", extras={"graph.npz": b"g"})
    (tmp_path / "blobs" / ("f" * 64 + ".onnx")).write_bytes(b"orphan")
    live = f"{_HOST}-{os.getpid()}-{'a' * 32}.m.json"  # a writer of this host that runs: this process
    dead = f"{_HOST}-{dead_pid()}-{'b' * 32}.m.json"
    for name in (live, dead, "legacy.m.json"):
        (tmp_path / "tmp" / name).write_bytes(b"{")
    assert store.gc(min_age_s=3600) == 1  # fresh blobs may belong to a put in flight; a dead writer's file goes
    assert files(tmp_path, "tmp") == {live, "legacy.m.json"}
    old = time.time() - STALE_TEMP_S - 60
    os.utime(tmp_path / "tmp" / "legacy.m.json", (old, old))  # a writer this host cannot check: gone when stale
    assert store.gc() == 2
    assert files(tmp_path, "blobs") == {f"{rec.checksum}.onnx", f"{rec.extra_checksums['graph.npz']}.graph.npz"}
    assert files(tmp_path, "tmp") == {live} and store.get("m") == b"kept"


def test_a_staged_extra_is_renamed_into_its_key_on_a_local_store_and_streamed_elsewhere(tmp_path):
    """A model's weights prepared in ``staging`` lie in the store's own tmp/: storing them moves that very file
    (same inode, nothing copied); a staged file that is not stored is removed; on a store without local files
    (a SubTreeFileSystem here) the staged file lies outside the store and is streamed in."""
    import hashlib

    import pyarrow.fs as pafs

    data = os.urandom(1 << 16)
    digest = hashlib.sha256(data).hexdigest()
    store = ModelStore(tmp_path / "zoo")
    with store.staging("weights.safetensors") as staged:
        assert Path(staged).parent == tmp_path / "zoo" / "tmp"
        Path(staged).write_bytes(data)
        inode = os.stat(staged).st_ino
        rec, _ = put(store, "m", b"g", extras={"weights.safetensors": staged}, content_extras=("weights.safetensors",),
                     known_checksums={"weights.safetensors": digest})
    stored = tmp_path / "zoo" / "blobs" / f"{digest}.weights.safetensors"
    assert os.stat(stored).st_ino == inode and stored.read_bytes() == data and files(tmp_path / "zoo", "tmp") == set()
    assert store.get_extra("m", "weights.safetensors") == data
    with store.staging("weights.safetensors") as unused:
        Path(unused).write_bytes(b"never stored")
    assert not os.path.exists(unused) and files(tmp_path / "zoo", "tmp") == set()
    (tmp_path / "remote").mkdir()
    remote = ModelStore.from_filesystem(pafs.SubTreeFileSystem(str(tmp_path / "remote"), pafs.LocalFileSystem()), "z")
    with remote.staging("weights.safetensors") as staged:
        assert not str(staged).startswith(str(tmp_path / "remote"))
        Path(staged).write_bytes(data)
        put(remote, "m", b"g", extras={"weights.safetensors": staged}, content_extras=("weights.safetensors",))
    assert not os.path.exists(staged) and remote.get_extra("m", "weights.safetensors") == data


def dead_pid() -> int:
    """The pid of a process of this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_faults_are_retried_then_reported(tmp_path):
    store = ModelStore(tmp_path, retries=2, retry_wait_s=0.001)
    put(store, "before", b"x")
    store._files.fs = Flaky(store._files.fs, {"open_output_stream"}, failures=2)
    put(store, "retried", b"y")  # two faults, two retries
    store._files.fs = Flaky(store._files.fs.fs, {"move"})
    with pytest.raises(StoreError, match=r"rename of 'blobs/.*\.onnx' in the zoo store at .* after 3 attempt"):
        put(store, "failed", b"z")
    store._files.fs = store._files.fs.fs
    assert [r.name for r in ModelStore(tmp_path).records()] == ["before", "retried"]
    assert files(tmp_path, "tmp") == set()  # the failed write cleaned its temp file


@pytest.mark.parametrize("code,fix", [(errno.EROFS, "read-only filesystem"), (errno.EACCES, "Permission denied"),
                                      (errno.ENOTDIR, "is a file, not a directory"), (errno.ENOSPC, "disk is full")])
def test_permanent_faults_fail_at_once_naming_the_model_and_the_zoo(tmp_path, code, fix):
    store = ModelStore(tmp_path, retries=3, retry_wait_s=1.0)
    put(store, "before", b"x")
    store._files.fs = flaky = Flaky(store._files.fs, {"open_output_stream"}, error=OSError(code, os.strerror(code)))
    t0 = time.monotonic()
    with pytest.raises(StoreError) as info:
        put(store, "m", b"y")
    msg = str(info.value)
    assert flaky.calls == 1 and time.monotonic() - t0 < 0.5, "a permanent fault is not retried"
    assert msg.startswith("could not register model 'm': write of 'blobs/") and str(tmp_path) in msg and fix in msg
    assert "'tmp/" not in msg and "attempt" not in msg, "the message names the model's key, not a temp file"
    with pytest.raises(StoreError, match=r"could not update model 'before': .*" + fix):
        store.update("before", hits=1.0)
    store._files.fs = flaky.fs
    assert [r.name for r in ModelStore(tmp_path).records()] == ["before"] and files(tmp_path, "tmp") == set()


def test_a_zoo_path_under_a_file_fails_at_once(tmp_path):
    (tmp_path / "file").write_bytes(b"not a directory")
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"create directory .* failed: .*Not a directory.*is a file, not a dir"):
        ModelStore(tmp_path / "file" / "zoo", retry_wait_s=1.0)
    assert time.monotonic() - t0 < 0.5
    with pytest.raises(ZooNotFoundError, match=r"no zoo at .*/file/zoo; `keeper register` creates one"):
        ModelStore(tmp_path / "file" / "zoo", mode="read")


def test_bad_uri_and_options(tmp_path):
    with pytest.raises(StoreError, match=r"cannot open the store URI 'nope://\*\*\*@x'") as info:
        ModelStore("nope://user:pw@x")
    assert "pw" not in str(info.value)
    with pytest.raises(StoreError, match="retries"):
        ModelStore(tmp_path, retries=-1)


# -- crash durability
WRITER = """
import os, sys
from keeper.store import ModelStore
store = ModelStore(sys.argv[1], retries=0)
chunk = os.urandom(1 << 20)
for i in range(10_000):
    tag = i.to_bytes(8, "little")
    store.put(f"m{i:05d}", tag + chunk * 16, accuracy=0.5, num_params=i, summary={"i": i},
              extras={"graph.npz": tag + chunk})
"""


def committed(d: Path) -> int:
    return len(files(d, "catalog"))


KILL_WHEN = {  # polled every ~1 ms; whichever moment comes first after the first commit
    "after-commit": lambda d: committed(d) >= 1,
    "mid-write": lambda d: committed(d) >= 1 and bool(files(d, "tmp")),
    "before-commit": lambda d: committed(d) >= 1 and len(files(d, "blobs")) > 2 * committed(d),
}


@pytest.mark.parametrize("moment", sorted(KILL_WHEN))
def test_sigkill_leaves_models_complete_or_absent(tmp_path, moment):
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO, env=env,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not KILL_WHEN[moment](tmp_path):
            assert proc.poll() is None, proc.stderr.read().decode()
            if time.monotonic() > deadline:  # the moment slipped by every time; any kill still tests the invariant
                assert committed(tmp_path) >= 1, "the writer committed nothing in 20 s"
                break
            time.sleep(0.001)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stderr.close()
    temp = files(tmp_path, "tmp")
    assert temp or moment != "mid-write" or committed(tmp_path) > 1, "killed mid-write, yet no temp file"
    store = ModelStore(tmp_path, mode="read")
    assert files(tmp_path, "tmp") == temp, "opening to read removes nothing"
    recs = store.records()
    assert len(recs) == len(files(tmp_path, "catalog")) >= 1  # every entry parses: no half model listed
    for rec in recs:
        assert len(store.get(rec.name)) == (16 << 20) + 8
        assert store.get_extra(rec.name, "graph.npz")[:8] == rec.num_params.to_bytes(8, "little")
    used = {f"{r.checksum}.onnx" for r in recs} | {f"{r.extra_checksums['graph.npz']}.graph.npz" for r in recs}
    orphans = files(tmp_path, "blobs") - used
    kept = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file() and f.parent.name != "tmp"
               and f.name not in orphans)
    if moment == "mid-write":  # a writer's open removes the dead writer's temp files, orphan blobs stay for gc
        ModelStore(tmp_path)
        assert files(tmp_path, "tmp") == set() and files(tmp_path, "blobs") == used | orphans
        temp = set()
    from keeper.cli import main

    assert main(["zoo", "gc", "--zoo", str(tmp_path), "--min-age", "0"]) == 0  # removes both
    assert files(tmp_path, "blobs") == used and files(tmp_path, "tmp") == set()
    assert sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()) == kept, "the space comes back"
    assert ModelStore(tmp_path).records() == recs


# -- S3 on a loopback moto server
BUCKET = "keeper-zoo"


@pytest.fixture(scope="module")
def moto():
    with running(BUCKET) as server:
        yield server


def s3fs(port: int, **kw):
    import pyarrow.fs as pafs

    # allow_delayed_open: small writes go out as one PutObject. moto answers CompleteMultipartUpload with a
    # <CompleteMultipartUploadResponse> root, which Arrow's embedded-error check rejects, so multipart uploads
    # (writes over 5 MiB) fail against moto; real S3 is unaffected.
    return pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", access_key="testing",
                             secret_key="testing", region="us-east-1", allow_delayed_open=True, **kw)


def test_s3_register_reopen_reload(moto):
    store = ModelStore.from_filesystem(s3fs(moto.port), f"{BUCKET}/zoo")
    put(store, "a", b"blob-a", extras={"graph.npz": b"ga"})
    put(store, "b", b"blob-b", extras={"graph.npz": b"gb"})
    assert store.uri == f"s3://{BUCKET}/zoo"
    other = ModelStore.from_filesystem(s3fs(moto.port), f"{BUCKET}/zoo")
    assert other.records() == store.records() and other.get_extra("b", "graph.npz") == b"gb"
    put(store, "c", b"blob-c")
    store.update("a", hits=1.0)
    assert "c" not in other
    other.reload()
    assert [r.name for r in other] == ["a", "b", "c"] and other.record("a").hits == 1.0
    assert other.get("c") == b"blob-c"
    other.remove("b")
    assert store.gc() == 0 and [r.name for r in ModelStore.from_filesystem(s3fs(moto.port), f"{BUCKET}/zoo")] \
        == ["a", "c"]


def test_s3_uri_form(moto):
    uri = f"s3://{BUCKET}/zoo-uri?endpoint_override=127.0.0.1:{moto.port}&scheme=http&region=us-east-1" \
          "&allow_delayed_open=true"
    store = ModelStore(uri)
    rec, created = put(store, "m", b"via-uri")
    assert created and store.uri == uri
    assert ModelStore(uri).get("m") == b"via-uri" and ModelStore(uri).records() == [rec]


def test_s3_missing_bucket_fails_at_once(moto):
    uri = f"s3://no-such-bucket/zoo?endpoint_override=127.0.0.1:{moto.port}&scheme=http&region=us-east-1" \
          "&allow_delayed_open=true"
    with pytest.raises(ZooNotFoundError, match=r"no zoo at s3://no-such-bucket/zoo\?"):
        ModelStore(uri, mode="read")
    store = ModelStore(uri, retries=3, retry_wait_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"could not register model 'm': write of 'blobs/.*bucket does not exist"):
        put(store, "m", b"blob")
    assert time.monotonic() - t0 < 2, "a missing bucket is not retried"


def test_s3_dead_endpoint_fails_fast(moto):
    import pyarrow.fs as pafs

    dead = s3fs(free_port(), retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1), connect_timeout=1)
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"list of 'catalog/' in the zoo store at s3://keeper-zoo/zoo .*reachable"):
        ModelStore.from_filesystem(dead, f"{BUCKET}/zoo", retries=1, retry_wait_s=0.01)
    assert time.monotonic() - t0 < 10


def test_s3_server_stopped_mid_commit(moto):
    import pyarrow.fs as pafs

    fs = s3fs(moto.port, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1), connect_timeout=1)
    store = ModelStore.from_filesystem(fs, f"{BUCKET}/crash", retries=1, retry_wait_s=0.01)
    put(store, "one", b"blob-one")
    put(store, "two", b"blob-two")

    def stop_before_catalog(method, args):  # the blobs land, then the server dies before the commit
        if "/catalog/" in args[0]:
            moto.stop()

    store._files.fs = Flaky(fs, {"open_output_stream"}, before=stop_before_catalog)
    t0 = time.monotonic()
    try:
        with pytest.raises(StoreError, match=r"write of 'catalog/three.json' in the zoo store at s3://keeper-zoo/"):
            put(store, "three", b"blob-three", extras={"graph.npz": b"g3"})
        assert time.monotonic() - t0 < 10
        with pytest.raises(StoreError):  # still down: reads fail the same bounded way
            store.reload()
    finally:
        if moto.server is None:
            moto.start()
    again = ModelStore.from_filesystem(s3fs(moto.port), f"{BUCKET}/crash")
    assert [r.name for r in again] == ["one", "two"] and again.get("two") == b"blob-two"
    assert again.gc() == 2  # the orphan blob and extra of "three"
    assert [r.name for r in again] == ["one", "two"] and again.get("one") == b"blob-one"


def test_templates_are_written_once_and_survive_gc(tmp_path):
    from keeper.store import ModelStore

    store = ModelStore(str(tmp_path / "zoo"))
    assert store.get_template("abc123") is None
    assert store.put_template("abc123", b"first") is True
    assert store.put_template("abc123", b"second") is False, "a signature's template is written once"
    store.gc()
    assert ModelStore(str(tmp_path / "zoo")).get_template("abc123") == b"first"
    with pytest.raises(AdmissionError):
        store.put_template("../escape", b"x")


def test_the_suite_runs_in_a_home_of_its_own():
    import pwd

    # the root conftest.py set HOME for the session (read from the environment, as every process sees it)
    home = os.path.expanduser("~")
    real = pwd.getpwuid(os.getuid()).pw_dir
    assert home == os.environ["HOME"] != real and home.startswith(tempfile.gettempdir())
    assert os.path.basename(home).startswith("keeper-test-home-")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("KEEPER_ZOO", None)
    out = subprocess.run([sys.executable, "-c", "from keeper.store import ModelStore; print(ModelStore().uri)"],
                         capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert out == os.path.join(home, ".keeper", "zoo"), "the default zoo is the session's, not yours"
