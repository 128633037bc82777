"""Every refusal of a zoo shared by teams, tried through the service (a real Ray, 2 CPUs, loopback) and the
``keeper`` command, with the message each one gives and whether the zoo stayed as it was.

The zoo gets its team table as an operator makes it (``keeper team init`` / ``team add`` / ``team policy``: two
teams, ``vision`` and ``audio``, audio with a byte budget of two models); the service starts with the shipped
defaults (``keeper.actors.start``). Each attempt is made, its error type and message recorded, and every stored
file but the log compared with its state before the attempt. Then the writes that are allowed (rm, restore,
an eviction inside audio's budget) and the log of the run.

Usage:
    python scripts/check_teams.py            # writes reports/check_teams.md

Exit status 1 when an attempt was not refused as expected or changed the zoo.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

ROOT = Path(__file__).resolve().parent.parent
SECRETS = {"vision": "vision-secret-7a1c", "audio": "audio-secret-52fe", "operator": "operator-secret-c09d"}


def mlp(width: int, seed: int) -> bytes:
    """A small MLP's ONNX bytes through keeper's own export (other seeds: other weights, same architecture)."""
    import torch
    from torch import nn

    from keeper.torch_support import export

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 10))
    return export(net, torch.randn(2, 16)).onnx


def stored(root: Path) -> dict[str, bytes]:
    """Every stored file but temp files and the log: 'the zoo as it was' means this is unchanged."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.parts[len(root.parts)] not in ("tmp", "log")}


def shell(*argv: str, env: dict | None = None) -> tuple[int, str]:
    """``keeper ARGV`` in a fresh process; its exit status and its stderr's last line."""
    run = subprocess.run([sys.executable, "-m", "keeper.cli", *argv], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, cwd=ROOT)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    return run.returncode, lines[-1] if lines else run.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", default=str(ROOT / "reports" / "check_teams.md"))
    args = ap.parse_args()

    import ray

    import keeper.actors as ka
    from keeper.actors.config import load_config
    from keeper.store import ModelStore
    from keeper.teams import Client

    work = Path(tempfile.mkdtemp(prefix="keeper-teams-"))
    zoo = str(work / "zoo")
    for team, secret in SECRETS.items():
        (work / f"{team}.secret").write_text(secret + "\n")
    op = ("--team", "operator", "--secret-file", str(work / "operator.secret"))
    size = len(mlp(32, 0))
    for argv in (("team", "init", "--operator-secret-file", str(work / "operator.secret")),
                 ("team", "add", "vision", "--team-secret-file", str(work / "vision.secret"), *op),
                 ("team", "add", "audio", "--team-secret-file", str(work / "audio.secret"),
                  "--capacity-bytes", str(2 * size + 4000), *op),
                 ("team", "policy", "--rate-burst", "20", "--rate-per-s", "1", *op)):
        code, err = shell(*argv, "--zoo", zoo)
        assert code == 0, f"keeper {' '.join(argv)}: {err}"

    def wire(team: str, secret: str | None = "right", **kw) -> dict:
        return Client(team=team, secret=SECRETS.get(team) if secret == "right" else secret, user=f"{team}-user",
                      **kw).to_wire()

    V, A = wire("vision"), wire("audio")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cfg = load_config(zoo=zoo, namespace="keeper-check-teams")
    handle = ka.start(cfg)

    def get(ref):
        return ray.get(ref, timeout=120)

    get(handle.register.remote(mlp(32, 1), 0.80, "v-resnet", client=V))
    get(handle.register.remote(mlp(32, 2), 0.82, "v-resnet-2", lineage={"parent": "v-resnet", "structure": 1.0},
                               client=V))
    get(handle.register.remote(mlp(48, 3), 0.90, "v-private", private=True, client=V))
    get(handle.register.remote(mlp(32, 4), 0.75, "a-model", client=A))
    get(handle.register.remote(mlp(40, 5), 0.70, "v-held", client=V))
    get(handle.remove.remote("v-held", client=V))
    get(handle.register.remote(mlp(24, 6), 0.70, "a-back", client=A))
    get(handle.remove.remote("a-back", client=A))
    get(handle.register.remote(mlp(24, 7), 0.60, "a-back", client=V))  # the name is live again, another owner
    for i in range(5):  # five models of one architecture (outlier_min_models): the outlier rule compares with them
        get(handle.register.remote(mlp(56, 20 + i), 0.50 + 0.01 * i, f"v-arch-{i}", client=V))

    rows: list[tuple[str, str, str, str, bool, bool]] = []  # (via, attempt, expected, got, unchanged, ok)

    def attempt(via: str, what: str, expected: str, call) -> None:
        before = stored(Path(zoo))
        try:
            out = call()
            got, message = "accepted", repr(out)[:200]
        except Exception as exc:  # noqa: BLE001 (what is caught is what is reported)
            cause = getattr(exc, "cause", None) or exc
            got, message = type(cause).__name__, str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        unchanged = stored(Path(zoo)) == before
        leaked = any(s in message for s in SECRETS.values())
        rows.append((via, what, expected, f"{got}: {message}", unchanged, got == expected and unchanged
                     and not leaked))

    svc = "service"
    attempt(svc, "audio removes vision's model", "NotOwnerError",
            lambda: get(handle.remove.remote("v-resnet", client=A)))
    attempt(svc, "audio updates the accuracy of vision's model", "NotOwnerError",
            lambda: get(handle.update.remote("v-resnet", 0.99, None, client=A)))
    attempt(svc, "audio makes vision's model private", "NotOwnerError",
            lambda: get(handle.update.remote("v-resnet", None, True, client=A)))
    attempt(svc, "audio records a training again on vision's model (Tune's repeated seeds)", "NotOwnerError",
            lambda: get(handle.register.remote(mlp(32, 1), 0.95, "trial-x", record_again=True, client=A)))
    attempt(svc, "audio restores vision's held model", "NotOwnerError",
            lambda: get(handle.restore.remote("v-held", client=A)))
    attempt(svc, "audio registers a model as team vision", "TeamMismatchError",
            lambda: get(handle.register.remote(mlp(64, 8), 0.5, "x", team="vision", client=A)))
    attempt(svc, "vision's name with a forged secret removes a model", "SecretRejectedError",
            lambda: get(handle.remove.remote("v-resnet", client=wire("vision", "forged-0000"))))
    attempt(svc, "vision's name without a secret removes a model", "SecretMissingError",
            lambda: get(handle.remove.remote("v-resnet", client=wire("vision", None))))
    attempt(svc, "a team the table does not hold registers", "UnknownTeamError",
            lambda: get(handle.register.remote(mlp(64, 8), 0.5, "x", client=wire("nobody", "some-secret"))))
    attempt(svc, "the default team (no team set) registers", "SecretMissingError",
            lambda: get(handle.register.remote(mlp(64, 8), 0.5, "x", client=Client(team=None).to_wire())))
    attempt(svc, "a read-only client registers", "ReadOnlyClientError",
            lambda: get(handle.register.remote(mlp(64, 8), 0.5, "x", client=wire("audio", None, read_only=True))))
    attempt(svc, "a read-only client removes a model", "ReadOnlyClientError",
            lambda: get(handle.remove.remote("a-model", client=wire("audio", None, read_only=True))))
    attempt(svc, "a read-only client that holds a secret asks for a parent", "ReadOnlyClientError",
            lambda: get(handle.choose.remote(mlp(32, 9), client=wire("audio", read_only=True))))
    attempt(svc, "audio registers with accuracy 1.5", "AdmissionError",
            lambda: get(handle.register.remote(mlp(64, 8), 1.5, "x", client=A)))
    attempt(svc, "audio registers with accuracy NaN", "AdmissionError",
            lambda: get(handle.register.remote(mlp(64, 8), float("nan"), "x", client=A)))
    attempt(svc, "audio registers 0.99 on an architecture whose 5 models hold at most 0.54",
            "ImplausibleAccuracyError", lambda: get(handle.register.remote(mlp(56, 30), 0.99, "x", client=A)))
    attempt(svc, "audio registers a model larger than its whole budget", "AdmissionError",
            lambda: get(handle.register.remote(mlp(512, 8), 0.5, "too-big", client=A)))
    attempt(svc, "vision restores 'a-back', whose name is live again (vision's now)", "RestoreConflictError",
            lambda: get(handle.restore.remote("a-back", client=A)))
    attempt(svc, "vision restores a name that was never held", "HeldModelNotFoundError",
            lambda: get(handle.restore.remote("never-was", client=V)))
    # a private model: no parent for another team, nor for a read-only client; a parent for its own team
    child = mlp(48, 10)
    theirs = get(handle.choose.remote(child, client=A)).parent
    mine = get(handle.choose.remote(child, client=V)).parent
    ro = get(handle.choose.remote(child, client=wire("audio", None, read_only=True))).parent
    rows.append((svc, "audio asks for a parent of vision's private architecture", "not v-private",
                 f"parent {theirs!r} (vision's own choice: {mine!r}, read-only: {ro!r})", True,
                 theirs != "v-private" and ro != "v-private" and mine == "v-private"))

    # a burst: 1,000 registrations from vision against the rate (vision's burst of 20 partly used already)
    blobs = [mlp(28, 100 + i) for i in range(1000)]
    def models_of(team: str) -> dict[str, tuple[dict, bytes]]:
        store = ModelStore(zoo, mode="read")
        return {r.name: (r.to_json(), store.get(r.name)) for r in store.records() if r.owner == team}

    before = models_of("audio")
    refused, first, accepted, t0 = 0, "", 0, time.monotonic()
    for i, blob in enumerate(blobs):
        try:
            get(handle.register.remote(blob, 0.75, f"burst-{i}", client=V))
            accepted += 1
        except Exception as exc:  # noqa: BLE001
            cause = getattr(exc, "cause", None) or exc
            refused += type(cause).__name__ == "RateLimitedError"
            first = first or f"{type(cause).__name__}: {str(cause).splitlines()[0]}"
    after = models_of("audio")
    rows.append((svc, f"vision registers 1,000 models in a burst ({time.monotonic() - t0:.1f} s)",
                 "RateLimitedError", f"{accepted} accepted, {refused} refused; first refusal: {first}; audio's models untouched",
                 after == before, refused >= 900 and accepted + refused == 1000 and after == before))

    # the shell, on the same zoo (a fresh process per command)
    sh = "keeper"
    au = ("--team", "audio", "--secret-file", str(work / "audio.secret"), "--zoo", zoo)
    for what, argv, env, expected in (
            ("audio's `keeper zoo rm` of vision's model", ("zoo", "rm", "v-resnet", *au), None, "NotOwnerError"),
            ("audio's `keeper zoo update --accuracy` of vision's model",
             ("zoo", "update", "v-resnet", "--accuracy", "0.1", *au), None, "NotOwnerError"),
            ("`keeper team add` without the operator's secret",
             ("team", "add", "intruder", "--team", "audio", "--secret-file", str(work / "audio.secret"),
              "--zoo", zoo), None, "NotOwnerError"),
            ("`keeper zoo rm --read-only` with KEEPER_SECRET_FILE set", ("zoo", "rm", "a-model", "--read-only",
                                                                        "--zoo", zoo),
             {"KEEPER_TEAM": "audio", "KEEPER_SECRET_FILE": str(work / "audio.secret")}, "ReadOnlyClientError"),
            ("vision's `keeper zoo rm` with audio's secret", ("zoo", "rm", "v-resnet", "--team", "vision",
                                                              "--secret-file", str(work / "audio.secret"),
                                                              "--zoo", zoo), None, "SecretRejectedError")):
        before = stored(Path(zoo))
        code, err = shell(*argv, env=env)
        unchanged = stored(Path(zoo)) == before
        rows.append((sh, what, expected, f"exit {code}: {err}", unchanged,
                     code == 1 and unchanged and not any(s in err for s in SECRETS.values())))

    # what is allowed: an eviction inside audio's budget, rm then restore, and the log
    s = ModelStore(zoo, mode="read")
    vision_before = {r.name: r.checksum for r in s.records() if r.owner == "vision"}
    for i in range(2):  # audio holds one model: the second of these is past its budget of two
        get(handle.register.remote(mlp(36, 40 + i), 0.74, f"a-new-{i}", client=A))
    s = ModelStore(zoo, mode="read")
    evicted = [h.name for h in s.held() if h.reason == "evicted"]
    kept_vision = {r.name: r.checksum for r in s.records() if r.owner == "vision"} == vision_before
    owners = sorted({h.record.owner for h in s.held() if h.reason == "evicted"})
    rows.append((svc, "audio's admission past its budget", "evicts an audio model only",
                 f"evicted {evicted} (owners {owners}); every vision model kept: {kept_vision}", True,
                 bool(evicted) and kept_vision and owners == ["audio"]))
    rec = ModelStore(zoo, mode="read").record("v-resnet-2").to_json()
    get(handle.remove.remote("v-resnet-2", client=V))
    back = get(handle.restore.remote("v-resnet-2", client=V))
    same = back["checksum"] == rec["checksum"] and back["summary"]["lineage"] == rec["summary"]["lineage"]
    rows.append((svc, "vision's rm then restore of its model", "the same model back",
                 f"same weights hash and lineage: {same}", True, same))
    log = get(handle.log.remote())
    ka.shutdown(cfg)
    ray.shutdown()

    ok = all(r[5] for r in rows)
    lines = ["# A zoo shared by teams: every refusal, through the service and the shell", "",
             "`python scripts/check_teams.py` (a real Ray with 2 CPUs on loopback, the service with the shipped "
             "defaults, the team table made with `keeper team`: teams `vision` and `audio`, audio's budget two "
             "models, a registration rate of 20 at once then 1 a second). \"Unchanged\": every stored file but the "
             "log is byte for byte as before the attempt. No message holds a secret.", "",
             "| via | attempt | expected | what it gave | zoo unchanged | as expected |", "|---|---|---|---|---|---|"]
    for via, what, expected, got, unchanged, good in rows:
        lines.append(f"| {via} | {what} | {expected} | {got.replace('|', '/')} | {'yes' if unchanged else 'NO'} | "
                     f"{'yes' if good else 'NO'} |")
    lines += ["", f"The log of the run: {len(log)} entries, in order: "
              + ", ".join(f"{e['action']} {e['model']}" for e in log[:12]) + (", ..." if len(log) > 12 else ""),
              "", f"All as expected: {'yes' if ok else 'NO'}."]
    Path(args.report).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
