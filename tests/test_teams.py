"""Tests of keeper.teams, keeper.guard, the holding area and the audit log, without Ray: who may do what in a zoo
with two teams (each refusal typed, named and leaving the zoo as it was), read-only clients, a zoo without teams
as before, budgets per team, the registration rate, implausible accuracies, rm then restore, the log, and a crash at
every step of a hold or a restore leaving the model live or held. The service's side is tests/test_teams_service.py.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import pytest

import nets
from keeper.errors import (AdmissionError, ConfigError, HeldModelNotFoundError, ImplausibleAccuracyError,
                           ModelNotFoundError, NotOwnerError, RateLimitedError, ReadOnlyClientError,
                           RestoreConflictError, SecretMissingError, SecretRejectedError, TeamMismatchError,
                           UnknownTeamError)
from keeper.store import ModelStore
from keeper.teams import OPERATOR, Access, Client, SecretHash, TeamEntry, TeamTable
from keeper.zoo import Zoo, ZooConfig

mlp = functools.partial(nets.mlp_onnx, scale=0.1)
SECRETS = {"vision": "vision-secret-0001", "audio": "audio-secret-0001", OPERATOR: "operator-secret-0001"}
# few iterations: these tests check the rules, not the key derivation's cost (one test checks the default's)
FAST = 1000


def table(**teams_kw) -> TeamTable:
    teams = {n: TeamEntry(n, SecretHash.of(SECRETS[n], FAST), **teams_kw.get(n, {})) for n in ("vision", "audio")}
    return TeamTable(operator=SecretHash.of(SECRETS[OPERATOR], FAST), teams=teams)


def client(team: str, secret: str | None = "right", **kw) -> Client:
    return Client(team=team, secret=SECRETS.get(team) if secret == "right" else secret, user=f"{team}-user", **kw)


V, A, OP = client("vision"), client("audio"), client(OPERATOR)


def shared(tmp_path: Path, t: TeamTable | None = None, config: ZooConfig | None = None) -> Path:
    root = tmp_path / "zoo"
    store = ModelStore(root)
    store.write_teams((t or table()).to_bytes())
    return root


def files(root: Path) -> dict[str, bytes]:
    """Every stored file but temp files and the log: 'the zoo as it was' means this is unchanged."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.parts[len(root.parts)] not in ("tmp", "log")}


def live_or_held(root: Path, name: str) -> str:
    store = ModelStore(root, mode="read")
    live = name in {r.name for r in store.records()}
    held = any(h.name == name for h in store.held())
    assert live or held, f"model {name!r} is neither live nor held: lost"
    return "both" if live and held else "live" if live else "held"


# ---------------------------------------------------------------------------------------------- secrets, clients


def test_secrets_are_kept_as_salted_hashes_and_never_shown():
    h = SecretHash.of("a-secret-of-vision")
    assert h.iterations == 200_000 and h.matches("a-secret-of-vision") and not h.matches("a-secret-of-visioN")
    assert "a-secret" not in repr(h) and h.digest not in repr(h)
    again = SecretHash.of("a-secret-of-vision")
    assert again.salt != h.salt and again.digest != h.digest, "salted: one secret, two hashes"
    raw = table().to_bytes().decode()
    assert not any(s in raw for s in SECRETS.values()) and json.loads(raw)["teams"]["vision"]["secret"]["kdf"]
    assert "vision-secret" not in repr(V) and "<given>" in repr(V)
    with pytest.raises(ConfigError, match="at least 8"):
        SecretHash.of("short")


def test_a_client_comes_from_its_environment_or_config(tmp_path):
    secret_file = tmp_path / "vision.secret"
    secret_file.write_text("vision-secret-0001\n")
    c = Client.from_env(environ={"KEEPER_TEAM": "vision", "KEEPER_SECRET_FILE": str(secret_file),
                                 "KEEPER_USER": "ana"})
    assert (c.team, c.secret, c.user, c.read_only) == ("vision", "vision-secret-0001", "ana", False)
    assert Client.from_env("audio", environ={"KEEPER_TEAM": "vision", "KEEPER_SECRET": "s" * 9}).team == "audio"
    assert Client.from_env(environ={}).team == "default" and Client.from_env(environ={}).secret is None
    ro = Client.from_env(environ={"KEEPER_TEAM": "vision", "KEEPER_READ_ONLY": "1"})
    assert ro.read_only and ro.secret is None
    with pytest.raises(ReadOnlyClientError, match="read-only, yet KEEPER_SECRET gives it a secret for team 'vision'"):
        Client.from_env(environ={"KEEPER_TEAM": "vision", "KEEPER_READ_ONLY": "true", "KEEPER_SECRET": "s" * 9})
    with pytest.raises(ConfigError, match="cannot be read"):
        Client.from_env(environ={"KEEPER_SECRET_FILE": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="team name 'a b'"):
        Client.from_env("a b", environ={})
    from keeper.actors.config import load_config

    cfg = load_config(team="audio", secret_file=str(secret_file), user="bo")
    assert Client.from_config(cfg).to_wire()["secret"] == "vision-secret-0001"
    assert Client.from_config(cfg).team == "audio"
    with pytest.raises(ConfigError, match="team"):
        load_config(team="no spaces")


# ---------------------------------------------------------------------------------------------- a zoo without teams


def test_a_zoo_without_teams_is_one_default_team_and_its_files_are_as_before(tmp_path):
    zoo = Zoo(str(tmp_path / "zoo"), client=Client())
    rec = zoo.register(mlp([16, 10], seed=1), 0.8, "m")
    entry = json.loads((tmp_path / "zoo" / "catalog" / "m.json").read_text())
    assert rec.owner == "default" and not {"owner", "user", "private"} & set(entry), "written as before teams"
    # a declared team is recorded, not checked; any client may change any model (as before teams)
    other = Zoo(str(tmp_path / "zoo"), client=Client(team="vision", secret="ignored-here"))
    theirs = other.register(mlp([24, 10], seed=2), 0.7, "theirs")
    assert theirs.owner == "vision" and theirs.user is None
    zoo.update("theirs", accuracy=0.75)
    zoo.remove("theirs")
    assert zoo.restore("theirs").accuracy == 0.75
    # a catalog entry of an older keeper (no owner field) opens as the default team's
    entry.pop("owner", None)
    (tmp_path / "zoo" / "catalog" / "m.json").write_text(json.dumps(entry))
    assert Zoo(str(tmp_path / "zoo")).record("m").owner == "default"
    with pytest.raises(ReadOnlyClientError, match="read-only"):  # read-only means read-only, teams or not
        Zoo(str(tmp_path / "zoo"), client=Client(read_only=True)).remove("m")


# ---------------------------------------------------------------------------------------------- two teams


def test_one_team_cannot_change_the_others_models_and_each_attempt_leaves_the_zoo_as_it_was(tmp_path):
    root = shared(tmp_path)
    vision = Zoo(root, client=V)
    blob = mlp([16, 10], seed=1)
    rec = vision.register(blob, 0.8, "v1")
    assert (rec.owner, rec.user) == ("vision", "vision-user")
    Zoo(root, client=A).register(mlp([24, 10], seed=2), 0.7, "a1")
    vision.remove("v1")  # a hold of its own, so a restore by the other team can be tried
    vision.register(mlp([16, 10], seed=3), 0.8, "v2")
    before = files(root)

    def audio() -> Zoo:  # opened afresh, as another process would
        return Zoo(root, client=A)

    attempts = {
        "remove": lambda: audio().remove("v2"),
        "update": lambda: audio().update("v2", accuracy=0.99),
        "private": lambda: audio().update("v2", private=True),
        "update-accuracy": lambda: audio().register(mlp([16, 10], seed=3), 0.95, "v2", update_accuracy=True),
        "alias": lambda: audio().register(mlp([16, 10], seed=3), 0.8, "v2-mine", alias=True),
        "record-again": lambda: audio().register(mlp([16, 10], seed=3), 0.95, "trial-x", record_again=True),
        "restore": lambda: audio().restore("v1"),
        "other team named": lambda: audio().register(mlp([32, 10], seed=4), 0.6, "x", team="vision"),
        "no secret": lambda: Zoo(root, client=client("vision", None)).remove("v2"),
        "forged secret": lambda: Zoo(root, client=client("vision", "not-the-secret")).remove("v2"),
        "unknown team": lambda: Zoo(root, client=client("nobody", "some-secret")).register(mlp([8, 10]), 0.5, "n"),
        "read-only": lambda: Zoo(root, client=client("vision", None, read_only=True)).remove("v2"),
        "read-only with a secret": lambda: Zoo(root, client=client("vision", read_only=True)).register(
            mlp([8, 10]), 0.5, "n"),
        "default team without a secret": lambda: Zoo(root, client=Client()).register(mlp([8, 10]), 0.5, "n"),
    }
    expected = {"remove": NotOwnerError, "update": NotOwnerError, "private": NotOwnerError,
                "update-accuracy": NotOwnerError, "alias": NotOwnerError, "record-again": NotOwnerError,
                "restore": NotOwnerError, "other team named": TeamMismatchError, "no secret": SecretMissingError,
                "forged secret": SecretRejectedError, "unknown team": UnknownTeamError,
                "read-only": ReadOnlyClientError, "read-only with a secret": ReadOnlyClientError,
                "default team without a secret": SecretMissingError}
    for what, attempt in attempts.items():
        with pytest.raises(expected[what]) as info:
            attempt()
        message = str(info.value)
        assert "secret-0001" not in message, f"{what}: a secret in the message"
        if expected[what] is NotOwnerError:
            assert "'vision'" in message and ("'v2'" in message or "'v1'" in message) and "operator" in message
        assert files(root) == before, f"{what} changed the zoo"
    # the operator may do each of them
    Zoo(root, client=OP).update("v2", accuracy=0.85)
    assert Zoo(root, client=OP).restore("v1").owner == "vision"
    Zoo(root, client=OP).remove("a1")
    assert Zoo(root, client=OP).register(mlp([32, 10], seed=4), 0.6, "for-audio", team="audio").owner == "audio"


def test_private_models_are_parents_only_for_their_team(tmp_path):
    root = shared(tmp_path)
    Zoo(root, client=V).register(mlp([24, 10], seed=1), 0.9, "secret-sauce", private=True)
    Zoo(root, client=A).register(mlp([20, 10], seed=2), 0.6, "public")
    child = mlp([24, 10], seed=9)
    assert Zoo(root, client=V).warm(child, noise=0).parent == "secret-sauce"
    assert Zoo(root, client=A).warm(child, noise=0).parent == "public"
    assert Zoo(root, client=client("vision", None, read_only=True)).warm(child, noise=0).parent == "public", \
        "a private model needs its team's secret"
    assert Zoo(root, client=OP).readable() == ["public", "secret-sauce"]
    with pytest.raises(NotOwnerError, match="private to team 'vision'"):
        Zoo(root, client=A).guard.record("secret-sauce")


def test_a_read_only_client_warms_and_registers_nothing(tmp_path):
    root = shared(tmp_path)
    Zoo(root, client=V).register(mlp([24, 10], seed=1), 0.9, "p")
    before = files(root)
    ro = Zoo(root, client=Client(team="audio", read_only=True))
    assert ro.warm(mlp([24, 10], seed=2), noise=0).parent == "p"
    for attempt in (lambda: ro.register(mlp([32, 10], seed=3), 0.5, "n"), lambda: ro.remove("p"),
                    lambda: ro.update("p", accuracy=0.1), lambda: ro.gc()):
        with pytest.raises(ReadOnlyClientError, match="read-only"):
            attempt()
    after = files(root)
    assert {k for k in after if not k.startswith("catalog")} == {k for k in before if not k.startswith("catalog")}
    assert after.keys() == before.keys(), "registers nothing (its warm's hit is a usage count, not a model)"


# ---------------------------------------------------------------------------------------------- budgets, rate, accuracy


def test_a_teams_admission_evicts_only_its_own_models_and_other_teams_hits_count(tmp_path):
    size = len(mlp([16, 10], seed=0))
    root = shared(tmp_path, table(vision={"capacity_bytes": None}, audio={"capacity_bytes": 2 * size + 2000}))
    vision, audio = Zoo(root, client=V), Zoo(root, client=A)
    for i in range(3):
        vision.register(mlp([16, 10], seed=10 + i), 0.8, f"v{i}")
    audio.register(mlp([16, 10], seed=1), 0.8, "a-used")
    audio.register(mlp([16, 10], seed=2), 0.8, "a-unused")
    for _ in range(3):
        vision.hit("a-used")  # another team's uses: worth keeping
    audio.register(mlp([16, 10], seed=3), 0.8, "a-new")
    names = set(Zoo(root, client=OP).names())
    assert {"v0", "v1", "v2"} <= names, "no vision model was touched"
    assert "a-unused" not in names and {"a-used", "a-new"} <= names
    assert [(h.name, h.reason, h.by["team"]) for h in audio.held()] == [("a-unused", "evicted", "audio")]
    assert audio.record("a-used").summary["hits_by"] == {"vision": 3}
    # the global budget is divided: each of the two teams (and the default team, while it holds models) its share
    access = Access(ModelStore(root))
    assert access.budget("vision", 900, {"vision", "audio"}) == 450
    assert access.budget("vision", 900, {"vision", "audio", "default"}) == 300
    assert access.budget("audio", 900, {"vision", "audio"}) == 450
    assert access.budget("audio", None, ()) == 2 * size + 2000
    with pytest.raises(AdmissionError, match="exceeds the budget of team 'audio'"):
        audio.register(mlp([512, 10], seed=4), 0.8, "too-big")


def test_a_burst_of_registrations_from_one_team_is_rate_limited_and_touches_no_other_team(tmp_path):
    t = table()
    root = shared(tmp_path, TeamTable(t.operator, t.teams, rate_burst=20, rate_per_s=1.0))
    now = [0.0]
    audio = Zoo(root, client=A)
    audio.access._clock = lambda: now[0]
    Zoo(root, client=V).register(mlp([16, 10], seed=1), 0.8, "vision-model")
    before = files(root)
    blob = mlp([16, 10], seed=2)
    refused = []
    for i in range(1000):
        try:
            audio.register(blob, 0.7, f"burst-{i}", alias=i > 0)
        except RateLimitedError as exc:
            refused.append(str(exc))
    assert len(refused) == 980 and "team 'audio'" in refused[0] and "Retry in 1.0 s" in refused[0]
    assert set(Zoo(root).names()) == {"vision-model"} | {f"burst-{i}" for i in range(20)}
    assert {k: v for k, v in files(root).items() if "vision-model" in k or k.startswith("access")} == \
        {k: v for k, v in before.items() if "vision-model" in k or k.startswith("access")}
    now[0] += 1.0  # the rate refills
    audio.register(blob, 0.7, "later", alias=True)
    Zoo(root, client=OP).register(mlp([16, 10], seed=3), 0.7, "operators-are-not-limited", team="audio")


def test_an_accuracy_implausibly_above_its_architecture_is_refused(tmp_path):
    root = shared(tmp_path)
    vision = Zoo(root, client=V)
    for i in range(5):
        vision.register(mlp([16, 10], seed=i), 0.50 + 0.01 * i, f"m{i}")
    before = files(root)
    with pytest.raises(ImplausibleAccuracyError, match=r"'cheat': accuracy 0.9900 is above every one of the 5 models "
                                                       r"of its architecture in the zoo \(best 0.5400\)"):
        Zoo(root, client=A).register(mlp([16, 10], seed=9), 0.99, "cheat")
    assert files(root) == before
    assert Zoo(root, client=A).register(mlp([16, 10], seed=9), 0.7, "better").accuracy == 0.7  # within the gap
    assert Zoo(root, client=A).register(mlp([48, 10], seed=9), 0.99, "another-arch").accuracy == 0.99
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(AdmissionError, match="outside"):
            vision.register(mlp([16, 10], seed=20), bad, "bad")


# ---------------------------------------------------------------------------------------------- hold, restore, log


def test_rm_then_restore_gives_back_the_same_model_and_a_held_model_is_never_a_parent(tmp_path):
    root = shared(tmp_path)
    vision = Zoo(root, client=V)
    parent = vision.register(mlp([24, 10], seed=1), 0.8, "parent")
    rec = vision.register(mlp([24, 10], seed=2), 0.9, "child", lineage={"parent": "parent", "structure": 1.0})
    vision.hit("child")
    rec = vision.record("child")
    held = vision.remove("child")
    assert held.reason == "removed" and held.by["team"] == "vision" and "child" not in vision
    assert vision.warm(mlp([24, 10], seed=3), noise=0).parent == "parent", "a held model is never chosen"
    back = vision.restore("child")
    assert back == rec and back.checksum == rec.checksum and back.summary["lineage"] == rec.summary["lineage"]
    assert Zoo(root).store.get("child") == mlp([24, 10], seed=2) and vision.held() == []
    # a restore of a name that is live again is refused; under another name it is allowed
    vision.remove("child")
    Zoo(root, client=A).register(mlp([24, 10], seed=5), 0.7, "child")
    before = files(root)
    with pytest.raises(RestoreConflictError, match="'child' cannot be restored.*live again, owned by team 'audio'"):
        vision.restore("child")
    assert files(root) == before
    assert vision.restore("child", as_name="child-again").checksum == rec.checksum
    with pytest.raises(HeldModelNotFoundError, match="'child' is live"):
        vision.restore("child")
    with pytest.raises(HeldModelNotFoundError, match="not in the holding area"):
        vision.restore("never-was")
    assert parent.name in vision


def test_gc_deletes_held_models_only_once_their_retention_has_ended(tmp_path):
    t = table()
    root = shared(tmp_path, TeamTable(t.operator, t.teams, retention_s=3600.0))
    vision = Zoo(root, client=V)
    vision.register(mlp([16, 10], seed=1), 0.8, "old")
    vision.remove("old")
    assert vision.gc(min_age_s=0) == (0, [])
    store = vision.store
    assert [h.name for h in store.expire(3600.0, now=store.held()[0].held_at + 3601)] == ["old"]
    assert vision.held() == [] and not list((root / "held").iterdir())


def test_the_log_lists_every_write_in_order_and_losing_it_loses_no_model(tmp_path, caplog):
    root = shared(tmp_path, table(audio={"capacity_bytes": len(mlp([16, 10])) + 1500}))
    vision, audio = Zoo(root, client=V), Zoo(root, client=A)
    vision.register(mlp([16, 10], seed=1), 0.8, "v")
    vision.update("v", accuracy=0.82)
    vision.update("v", private=True)
    audio.register(mlp([16, 10], seed=2), 0.7, "a")
    audio.register(mlp([16, 10], seed=3), 0.7, "a2")  # evicts "a"
    vision.remove("v")
    vision.restore("v")
    with pytest.raises(NotOwnerError):
        audio.remove("v")  # refused: nothing to log
    got = [(e.action, e.model, e.owner, e.team) for e in vision.log()]
    assert got == [("register", "v", "vision", "vision"), ("update", "v", "vision", "vision"),
                   ("private", "v", "vision", "vision"), ("register", "a", "audio", "audio"),
                   ("register", "a2", "audio", "audio"), ("evict", "a", "audio", "audio"),
                   ("remove", "v", "vision", "vision"), ("restore", "v", "vision", "vision")]
    entries = vision.log()
    assert all(e.host and e.pid and e.user for e in entries) and entries == sorted(entries, key=lambda e: e.seq)
    assert entries[1].details == {"accuracy": 0.82, "before": 0.8}
    assert [e.action for e in vision.log(model="a")] == ["register", "evict"] and len(vision.log(last=2)) == 2
    logs = sorted((root / "log").iterdir())
    logs[2].write_text("{ damaged")
    with caplog.at_level(logging.WARNING, logger="keeper"):
        assert len(vision.log()) == 7
    assert "skipping damaged log entry" in caplog.text
    for p in logs:
        p.unlink()
    (root / "log").rmdir()
    again = Zoo(root, client=V)
    assert again.names() == ["a2", "v"] and again.log() == [] and again.held()[0].name == "a"
    assert again.restore("a", client=A).name == "a"


# ---------------------------------------------------------------------------------------------- crash at every step


class Crash(BaseException):
    """A kill of the process, as far as the code under test can tell (nothing catches a BaseException)."""


def crash_at(store: ModelStore, step: int) -> list[str]:
    """Make the ``step``-th change to ``store``'s files raise :class:`Crash`; returns the changes seen."""
    seen: list[str] = []
    files = store._files
    for op in ("write", "copy", "delete", "delete_dir"):
        real = getattr(files, op)

        def wrapped(*args, _real=real, _op=op, **kw):
            if len(seen) == step:
                raise Crash(f"{_op} {args[0]}")
            seen.append(f"{_op} {args[-1] if _op == 'copy' else args[0]}")
            return _real(*args, **kw)
        setattr(files, op, wrapped)
    return seen


@pytest.mark.parametrize("operation", ["remove", "restore"])
def test_a_crash_at_any_step_of_a_hold_or_a_restore_leaves_the_model_live_or_held(tmp_path, operation):
    steps = None
    step = 0
    while steps is None or step <= steps:
        root = tmp_path / f"{operation}-{step}"
        store = ModelStore(root)
        rec, _ = store.put("m", mlp([16, 10], seed=1), accuracy=0.8, num_params=1, summary={"lineage": {"x": 1}},
                           extras={"graph.npz": b"graph-bytes"})
        store.put("shares-the-graph", mlp([16, 10], seed=2), accuracy=0.8, num_params=1, summary={},
                  extras={"graph.npz": b"graph-bytes"})
        if operation == "restore":
            store.remove("m")
        seen = crash_at(store, step)
        try:
            store.remove("m") if operation == "remove" else store.restore("m")
            steps = len(seen)  # the run without a crash: how many steps there are
        except Crash:
            pass
        state = live_or_held(root, "m")
        fresh = ModelStore(root)
        if operation == "remove" and state != "held":
            fresh.remove("m")  # a remove after the crash completes it
        if operation == "restore" and state != "live":
            fresh.restore("m")  # as does a restore
        final = ModelStore(root, mode="read")
        if operation == "restore":
            assert final.record("m") == rec and final.get("m") == mlp([16, 10], seed=1) and final.held() == []
            assert final.get_extra("m", "graph.npz") == b"graph-bytes"
        else:
            assert "m" not in final and final.held()[-1].record == rec
        assert final.get_extra("shares-the-graph", "graph.npz") == b"graph-bytes", "a shared blob was lost"
        step += 1
    assert steps >= 4


# ---------------------------------------------------------------------------------------------- the shell


def test_the_shell_runs_the_same_rules(tmp_path, capsys, monkeypatch):
    from keeper.cli import main

    zoo = str(tmp_path / "zoo")
    for name, secret in SECRETS.items():
        (tmp_path / f"{name}.secret").write_text(secret + "\n")
    model = tmp_path / "m.onnx"
    model.write_bytes(mlp([16, 10], seed=1))

    def keeper(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*argv, "--zoo", zoo])
        out, err = capsys.readouterr()
        return code, out, err

    as_team = {n: ("--team", n, "--secret-file", str(tmp_path / f"{n}.secret")) for n in SECRETS}
    assert keeper("team", "init", "--operator-secret-file", str(tmp_path / "operator.secret"))[0] == 0
    code, _, err = keeper("team", "add", "vision", "--team-secret-file", str(tmp_path / "vision.secret"))
    assert code == 1 and "the team table is the operator's" in err
    for team in ("vision", "audio"):
        assert keeper("team", "add", team, "--team-secret-file", str(tmp_path / f"{team}.secret"),
                      *as_team[OPERATOR])[0] == 0
    assert "secret-0001" not in (tmp_path / "zoo" / "access" / "teams.json").read_text()
    code, out, _ = keeper("team", "ls")
    assert "audio" in out and "vision" in out and "hash" not in out and "salt" not in out
    assert keeper("register", str(model), "--accuracy", "0.8", "--name", "v", *as_team["vision"])[0] == 0
    code, out, err = keeper("zoo", "rm", "v", *as_team["audio"])
    assert code == 1 and "belongs to team 'vision', and team 'audio' may not" in err
    code, out, err = keeper("zoo", "rm", "v", "--team", "vision", "--secret-file", str(tmp_path / "audio.secret"))
    assert code == 1 and "does not match" in err and "secret-0001" not in err
    monkeypatch.setenv("KEEPER_TEAM", "vision")
    monkeypatch.setenv("KEEPER_SECRET_FILE", str(tmp_path / "vision.secret"))
    code, out, err = keeper("zoo", "rm", "v")
    assert code == 0 and out.strip() == "removed v" and "keeper zoo restore v" in err
    code, out, _ = keeper("zoo", "held")
    assert "v " in out and "removed" in out
    code, out, _ = keeper("zoo", "restore", "v")
    assert code == 0 and out.startswith("restored v (accuracy 0.8000, owner vision")
    code, out, err = keeper("register", str(model), "--accuracy", "0.8", "--name", "w", "--read-only")
    assert code == 1 and "read-only, yet KEEPER_SECRET_FILE" in err and "secret-0001" not in err
    monkeypatch.delenv("KEEPER_SECRET_FILE")
    code, out, err = keeper("register", str(model), "--accuracy", "0.8", "--name", "w", "--read-only")
    assert code == 1 and "this client is read-only" in err
    code, out, _ = keeper("zoo", "log")
    lines = out.splitlines()
    assert [ln.split()[2] for ln in lines] == ["teams", "teams", "teams", "register", "remove", "restore"]
    assert "owner=vision by=vision/" in lines[3]
    code, out, _ = keeper("zoo", "log", "--json", "--model", "v")
    assert [e["action"] for e in json.loads(out)] == ["register", "remove", "restore"]
    code, out, _ = keeper("zoo", "ls")
    assert out.splitlines()[1].split()[-2:] == ["owner", "private"]


def test_the_tune_callback_and_warm_start_name_the_team_from_their_config(tmp_path, monkeypatch):
    from keeper.tune_integration import advice
    from keeper.tune_integration.callback import KeeperCallback

    secret = tmp_path / "vision.secret"
    secret.write_text(SECRETS["vision"])
    monkeypatch.setenv("KEEPER_TEAM", "audio")
    callback = KeeperCallback(metric="accuracy", team="vision", secret_file=str(secret), zoo=str(tmp_path / "z"))
    assert (callback.client.team, callback.client.secret) == ("vision", SECRETS["vision"])
    assert KeeperCallback(metric="accuracy", zoo=str(tmp_path / "z")).client.team == "audio", "else $KEEPER_TEAM"
    text = advice.refused("t1", SecretMissingError("registering model 't1' needs the secret of team 'vision'"))
    assert "KeeperCallback(..., team=..., secret_file=...)" in text
