"""Teams through the Ray service (2 CPUs, loopback; one Ray and one service for the module) and its shell: one team
cannot remove, update or evict another's models (each attempt leaves the zoo as it was), a read-only client warms and
registers nothing, rm then restore gives back the same model, the log lists every write of the run in order, and a
kill of the ZooManager in the middle of a restore or an eviction leaves each model live or held."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

import nets
from keeper.actors.manager import ZooManager
from keeper.errors import (KeeperError, NotOwnerError, ReadOnlyClientError, SecretMissingError, SecretRejectedError,
                           ServiceError, TeamMismatchError)
from keeper.store import ModelStore
from keeper.teams import OPERATOR, Client, SecretHash, TeamEntry, TeamTable

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]

NAMESPACE = "keeper-teams-test"
mlp = functools.partial(nets.mlp_onnx, scale=0.1)
SIZE = len(mlp([16, 10]))
SECRETS = {"vision": "vision-secret-0002", "audio": "audio-secret-0002", OPERATOR: "operator-secret-0002"}


def wire(team: str, secret: str | None = "right", **kw) -> dict:
    return Client(team=team, secret=SECRETS[team] if secret == "right" else secret, user=f"{team}-user",
                  **kw).to_wire()


V, A = wire("vision"), wire("audio")


class PausingManager(ZooManager):
    """The ZooManager with a pause the test sets: before its store writes, copies or deletes a key holding the text
    of ``<pause_dir>/at`` (``"<op> <text>"``), it writes ``<pause_dir>/paused`` and sleeps, so the test kills it in
    the middle of a hold or a restore."""

    def __init__(self, config, pause_dir: str):
        super().__init__(config)
        files = self.zoo.store._files
        for op in ("write", "copy", "delete", "delete_dir"):
            real = getattr(files, op)

            def paused(*args, _real=real, _op=op, **kw):
                at = Path(pause_dir, "at")
                key = args[-1] if _op == "copy" else args[0]
                if at.exists():
                    want_op, want = at.read_text().split(" ", 1)
                    if want_op == _op and want in key:
                        Path(pause_dir, "paused").write_text(key)
                        time.sleep(600)
                return _real(*args, **kw)
            setattr(files, op, paused)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    import ray

    import keeper.actors as ka
    from keeper.actors.config import load_config

    root = tmp_path_factory.mktemp("zoo")
    pause = tmp_path_factory.mktemp("pause")
    teams = {"vision": TeamEntry("vision", SecretHash.of(SECRETS["vision"], 1000)),
             "audio": TeamEntry("audio", SecretHash.of(SECRETS["audio"], 1000), capacity_bytes=2 * SIZE + 2000)}
    ModelStore(root).write_teams(TeamTable(SecretHash.of(SECRETS[OPERATOR], 1000), teams).to_bytes())
    # no retries: a call the kill interrupts fails, so the store is seen as the kill left it
    cfg = load_config(zoo=str(root), namespace=NAMESPACE, matchers=0,
                      actors={"zoo_manager": {"max_task_retries": 0}}, timeouts={"start_s": 120.0})
    ray.remote(PausingManager).options(**cfg.actor_options("zoo_manager"), name=cfg.manager_name,
                                       namespace=cfg.namespace, lifetime="detached").remote(cfg, str(pause))
    handle = ka.start(cfg)
    yield handle, root, pause, cfg
    ka.shutdown(cfg)


def get(ref, timeout: float = 120.0):
    import ray

    return ray.get(ref, timeout=timeout)


def catalog(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "catalog").iterdir())}


def stored(root: Path) -> dict[str, bytes]:
    """The zoo's files but temp files and the log."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.parts[len(root.parts)] not in ("tmp", "log")}


def live_or_held(root: Path, name: str) -> str:
    store = ModelStore(root, mode="read")
    live, held = name in {r.name for r in store.records()}, any(h.name == name for h in store.held())
    assert live or held, f"model {name!r} is neither live nor held: lost"
    return "both" if live and held else "live" if live else "held"


def test_two_teams_read_only_clients_restores_and_the_log(service):
    handle, root, _, _ = service
    writes = []  # (action, model) of every write this test makes, in order
    get(handle.register.remote(mlp([16, 10], seed=1), 0.8, "v-parent", client=V))
    writes.append(("register", "v-parent"))
    child = get(handle.register.remote(mlp([16, 10], seed=2), 0.85, "v-child",
                                       lineage={"parent": "v-parent", "structure": 1.0}, client=V))
    writes.append(("register", "v-child"))
    for i in range(2):
        get(handle.register.remote(mlp([16, 10], seed=10 + i), 0.8, f"a-{i}", client=A))
        writes.append(("register", f"a-{i}"))
    before = stored(root)
    refusals = [
        (NotOwnerError, handle.remove.remote("v-child", client=A)),
        (NotOwnerError, handle.update.remote("v-child", 0.99, None, client=A)),
        (NotOwnerError, handle.update.remote("v-child", None, True, client=A)),
        (NotOwnerError, handle.register.remote(mlp([16, 10], seed=2), 0.95, "trial", record_again=True, client=A)),
        (TeamMismatchError, handle.register.remote(mlp([16, 10], seed=3), 0.5, "x", client=A, team="vision")),
        (SecretRejectedError, handle.remove.remote("v-child", client=wire("vision", "forged-secret"))),
        (SecretMissingError, handle.remove.remote("v-child", client=wire("vision", None))),
        (ReadOnlyClientError, handle.register.remote(mlp([16, 10], seed=3), 0.5, "x",
                                                     client=wire("audio", None, read_only=True))),
        (ReadOnlyClientError, handle.choose.remote(mlp([16, 10], seed=3), client=wire("audio", read_only=True))),
    ]
    for kind, ref in refusals:
        with pytest.raises(kind) as info:
            get(ref)
        assert "secret-0002" not in str(info.value)
    assert stored(root) == before, "every refused attempt left the zoo as it was"
    # the audio team's next model evicts one of audio's own, never a vision model
    get(handle.register.remote(mlp([16, 10], seed=12), 0.8, "a-2", client=A))
    writes += [("register", "a-2"), ("evict", "a-0")]
    s = ModelStore(root, mode="read")
    assert {r.name for r in s.records()} == {"v-parent", "v-child", "a-1", "a-2"}
    assert [(h.name, h.reason) for h in s.held()] == [("a-0", "evicted")]
    # a read-only client warms (from any team's public model) and registers nothing
    ro = wire("audio", None, read_only=True)
    before = catalog(root)
    result = get(handle.warm.remote(mlp([16, 10], seed=4), 0.0, client=ro))
    assert result.parent in {"v-parent", "v-child", "a-1", "a-2"}
    assert get(handle.choose.remote(mlp([16, 10], seed=4), client=ro)).parent == result.parent
    with pytest.raises(ReadOnlyClientError):
        get(handle.remove.remote("a-1", client=ro))
    assert catalog(root).keys() == before.keys()
    # rm then restore: the same model, the same weights hash, the same lineage
    as_removed = ModelStore(root, mode="read").record("v-child").to_json()  # with the read-only warm's hit
    held = get(handle.remove.remote("v-child", client=V))
    writes.append(("remove", "v-child"))
    assert held["reason"] == "removed" and "v-child.json" not in catalog(root)
    assert get(handle.choose.remote(mlp([16, 10], seed=5), client=V)).parent != "v-child", "held: never a parent"
    back = get(handle.restore.remote("v-child", client=V))
    writes.append(("restore", "v-child"))
    assert back["checksum"] == child["checksum"] and back["summary"]["lineage"] == child["summary"]["lineage"]
    assert back == as_removed and back["hits"] >= 1, "its statistics too"
    # the log lists every write of the run, in order
    log = get(handle.log.remote())
    assert [(e["action"], e["model"]) for e in log] == writes
    assert all(e["host"] and e["pid"] for e in log) and [e["team"] for e in log][-1] == "vision"


def test_the_shell_on_the_services_zoo(service, tmp_path, capsys):
    from keeper.cli import main

    handle, root, _, _ = service
    get(handle.register.remote(mlp([24, 10], seed=30), 0.7, "v-shell", client=V))
    (tmp_path / "audio.secret").write_text(SECRETS["audio"])
    (tmp_path / "vision.secret").write_text(SECRETS["vision"])
    capsys.readouterr()
    assert main(["zoo", "rm", "v-shell", "--zoo", str(root), "--team", "audio", "--secret-file",
                 str(tmp_path / "audio.secret")]) == 1
    err = capsys.readouterr().err
    assert "remove model 'v-shell': it belongs to team 'vision', and team 'audio' may not" in err
    assert main(["zoo", "rm", "v-shell", "--zoo", str(root), "--team", "vision", "--secret-file",
                 str(tmp_path / "vision.secret")]) == 0
    get(handle.reload.remote())  # the service takes in what the shell did
    assert get(handle.choose.remote(mlp([24, 10], seed=31), client=V)).parent != "v-shell"
    capsys.readouterr()
    assert main(["zoo", "log", "--zoo", str(root), "--model", "v-shell"]) == 0
    assert [ln.split()[2] for ln in capsys.readouterr().out.splitlines()] == ["register", "remove"]


def _kill_manager_at(service, op: str, key: str, call) -> None:
    """Run ``call()`` (a ref), kill the manager when it reaches ``op`` of a key holding ``key``, wait for it to
    come back."""
    import ray

    handle, _, pause, cfg = service
    (pause / "paused").unlink(missing_ok=True)
    (pause / "at").write_text(f"{op} {key}")
    ref = call()
    deadline = time.monotonic() + 120
    while not (pause / "paused").exists():
        assert time.monotonic() < deadline, f"the manager never reached {op} {key}"
        time.sleep(0.05)
    (pause / "at").unlink()
    ray.kill(ray.get_actor(cfg.manager_name, namespace=NAMESPACE), no_restart=False)
    with pytest.raises((ServiceError, KeeperError)):
        get(ref)
    deadline = time.monotonic() + 120
    while True:  # the restarted manager answers
        try:
            get(handle.manager_pid.remote(), timeout=30)
            break
        except (ServiceError, KeeperError):
            assert time.monotonic() < deadline, "the manager did not come back"
            time.sleep(0.5)


@pytest.mark.parametrize("op, where, state", [("write", "catalog/{name}.json", "held"),
                                              ("delete", "held/{name}@", "both")], ids=["before-commit", "after"])
def test_a_kill_in_the_middle_of_a_restore_leaves_the_model_live_or_held(service, op, where, state):
    handle, root, _, _ = service
    name = f"r-{op}"
    rec = get(handle.register.remote(mlp([20, 10], seed=40 + len(op)), 0.75, name, client=V))
    get(handle.remove.remote(name, client=V))
    _kill_manager_at(service, op, where.format(name=name),
                     lambda: handle.restore.remote(name, client=V))
    assert live_or_held(root, name) == state
    assert get(handle.restore.remote(name, client=V))["checksum"] == rec["checksum"]  # and a restore completes it
    assert live_or_held(root, name) == "live"


@pytest.mark.parametrize("op, where, state", [("write", "held/{name}@", "live"), ("delete", "catalog/{name}.json",
                                                                                   "both")], ids=["before", "after"])
def test_a_kill_in_the_middle_of_an_eviction_leaves_the_model_live_or_held(service, op, where, state):
    handle, root, _, _ = service
    s = ModelStore(root, mode="read")
    mine = sorted(r.name for r in s.records() if r.owner == "audio")
    for i in range(2 - len(mine)):  # audio's budget holds two models
        get(handle.register.remote(mlp([16, 10], seed=60 + i), 0.8, f"a-fill-{op}-{i}", client=A))
    mine = sorted(r.name for r in ModelStore(root, mode="read").records() if r.owner == "audio")
    victim = mine[0]  # equal accuracies and sizes, no hits: the first by name goes
    others = {r.name: r for r in ModelStore(root, mode="read").records() if r.owner != "audio"}
    _kill_manager_at(service, op, where.format(name=victim),
                     lambda: handle.register.remote(mlp([16, 10], seed=70 + len(op)), 0.8, f"a-new-{op}", client=A))
    assert live_or_held(root, victim) == state
    after = {r.name: r for r in ModelStore(root, mode="read").records() if r.owner != "audio"}
    assert after == others, "no other team's model was touched"
