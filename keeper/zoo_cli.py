"""``keeper zoo ...`` and ``keeper team ...``: a zoo's catalog, holding area, log and teams from a shell (added to
``keeper`` by keeper/cli.py), and who the shell is to the zoo (``--team``, ``--secret-file``, ``--read-only``).

Every write goes through :class:`keeper.guard.Guard` (or :class:`keeper.Zoo` where it needs graphs: ``restore``
keeps the team's budget), so the shell obeys the team rules of :mod:`keeper.teams` as far as the store lets it:
a shell with the bucket's credentials could write the files itself, and the docs say so.

Examples:
    keeper zoo rm resnet-a --team vision --secret-file ~/.keeper/vision.secret   # held, not deleted
    keeper zoo held ; keeper zoo restore resnet-a ; keeper zoo log --last 20
    keeper zoo update resnet-a --private
    KEEPER_TEAM=operator KEEPER_SECRET_FILE=op.secret keeper team add audio --capacity-bytes 20000000000
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any

from keeper.errors import HeldModelNotFoundError, KeeperError, ModelNotFoundError

__all__ = ["add_commands", "zoo_uri", "client_options", "client_of"]

ZOO_HELP = ("zoo location: a directory or any pyarrow.fs URI such as s3://bucket/zoo (default: $KEEPER_ZOO or "
            "~/.keeper/zoo)")


def zoo_uri(args: argparse.Namespace) -> str | None:
    """The zoo the command names: --zoo, else $KEEPER_ZOO, else None (the default, ~/.keeper/zoo)."""
    if args.zoo is not None:
        if not args.zoo.strip():
            raise KeeperError("--zoo is empty; give a directory or a URI such as s3://bucket/zoo")
        return args.zoo
    env = os.environ.get("KEEPER_ZOO")
    if env is not None and not env.strip():
        raise KeeperError("KEEPER_ZOO is set but empty; set it to a directory or a URI such as s3://bucket/zoo, "
                          "or unset it to use ~/.keeper/zoo")
    return env


def client_options(p: argparse.ArgumentParser) -> None:
    """``--team``, ``--secret-file`` and ``--read-only``: who the command is to the zoo."""
    p.add_argument("--team", help="your team in a shared zoo (default: $KEEPER_TEAM, else the default team)")
    p.add_argument("--secret-file", help="a file holding your team's secret, for writes and your team's private "
                                         "models (default: $KEEPER_SECRET, else $KEEPER_SECRET_FILE); a zoo "
                                         "without teams needs none")
    p.add_argument("--read-only", action="store_true",
                   help="connect read-only: hold no secret, write nothing (default: $KEEPER_READ_ONLY)")


def client_of(args: argparse.Namespace) -> Any:
    """The :class:`keeper.teams.Client` the command's options and the environment name."""
    from keeper.teams import Client

    return Client.from_env(getattr(args, "team", None), secret_file=getattr(args, "secret_file", None),
                           read_only=True if getattr(args, "read_only", False) else None)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# ---------------------------------------------------------------------------------------------- keeper zoo
def _cmd_zoo(args: argparse.Namespace) -> int:
    from keeper.guard import Guard
    from keeper.store import ModelStore

    if args.zoo_cmd == "restore":
        return _cmd_restore(args)
    # the catalog alone: listing, removing or cleaning a zoo reads no model graph
    writes = args.zoo_cmd in ("rm", "gc", "update")
    guard = Guard(ModelStore(zoo_uri(args), mode="write" if writes else "read"), client_of(args))
    try:
        return _zoo_action(args, guard)
    except HeldModelNotFoundError:
        raise
    except ModelNotFoundError:
        raise KeeperError(f"no model {args.name!r} in the zoo at {guard.store.uri}; `keeper zoo ls` lists them") \
            from None


def _zoo_action(args: argparse.Namespace, guard: Any) -> int:
    store = guard.store
    if args.zoo_cmd == "ls":
        names = guard.readable([r.name for r in store.records()], None)
        recs = [store.record(n) for n in names]
        if args.json:
            print(json.dumps([r.to_json() for r in recs], indent=1))
            return 0
        print(f"{len(recs)} models in {store.uri}")
        # the owner columns only where there are owners to tell apart: a zoo without teams lists as it always did
        teams = guard.access.has_teams or any(r.owner != "default" or r.private for r in recs)
        print(f"{'name':32s} {'accuracy':>8s} {'params':>12s} {'bytes':>12s} {'hits':>6s}"
              + (f" {'owner':16s} private" if teams else ""))
        for r in recs:
            print(f"{r.name:32s} {r.accuracy:8.4f} {r.num_params:12d} {r.nbytes:12d} {r.hits:6.1f}"
                  + (f" {r.owner:16s} {'yes' if r.private else 'no'}" if teams else ""))
    elif args.zoo_cmd == "info":
        print(json.dumps(guard.record(args.name).to_json(), indent=1, sort_keys=True))
    elif args.zoo_cmd == "rm":
        _, held = guard.remove(args.name)
        print(f"removed {args.name}")
        retention = guard.access.retention_s(_retention(args))
        print(f"keeper: {args.name} is held (hold {held.hold_id}) until {_when(held.expires_at(retention))}; "
              f"`keeper zoo restore {args.name}` brings it back", file=sys.stderr)
    elif args.zoo_cmd == "update":
        if args.accuracy is None and args.private is None:
            raise KeeperError("zoo update: give --accuracy, --private or --public")
        rec = guard.update(args.name, accuracy=args.accuracy, private=args.private)
        print(f"updated {rec.name}: accuracy {rec.accuracy:.4f}, {'private' if rec.private else 'public'}")
    elif args.zoo_cmd == "held":
        holds = guard.held()
        if args.json:
            print(json.dumps([h.summary() for h in holds], indent=1))
            return 0
        retention = guard.access.retention_s(_retention(args))
        print(f"{len(holds)} held models in {store.uri} (kept {retention / 86400:g} days, then `keeper zoo gc` "
              "deletes them)")
        print(f"{'name':32s} {'reason':8s} {'held at':19s} {'until':19s} {'owner':16s} {'by':16s} hold")
        for h in holds:
            print(f"{h.name:32s} {h.reason:8s} {_when(h.held_at)} {_when(h.expires_at(retention))} "
                  f"{h.record.owner:16s} {str(h.by.get('team', '?')):16s} {h.hold_id}")
    elif args.zoo_cmd == "log":
        entries = guard.entries(model=args.model, last=args.last,
                                since=None if args.since is None else time.time() - args.since)
        if args.json:
            print(json.dumps([e.to_json() for e in entries], indent=1))
            return 0
        for e in entries:
            who = f"{e.team}" + (f"/{e.user}" if e.user else "")
            facts = " ".join(f"{k}={v}" for k, v in sorted(e.details.items()) if v is not None)
            print(f"{_when(e.time)} {e.action:12s} {e.model or '-':32s} owner={e.owner or '-'} by={who} "
                  f"from={e.host}:{e.pid} {facts}".rstrip())
    elif args.zoo_cmd == "gc":
        count, gone = guard.gc(_retention(args), min_age_s=args.min_age)
        print(f"removed {count} leftover file(s) from {store.uri}")
        if gone:
            print(f"deleted {len(gone)} held model(s) whose retention had ended: "
                  + ", ".join(f"{h.name} ({h.reason} {_when(h.held_at)})" for h in gone))
    return 0


def _retention(args: argparse.Namespace) -> float:
    """The retention a zoo without a team table keeps: --retention-s where the command has it, else 7 days."""
    from keeper.zoo import ZooConfig

    value = getattr(args, "retention_s", None)
    return ZooConfig().retention_s if value is None else value


def _cmd_restore(args: argparse.Namespace) -> int:
    from keeper.zoo import Zoo

    zoo = Zoo(zoo_uri(args), client=client_of(args))  # a Zoo: the team's budget is kept as at a registration
    rec = zoo.restore(args.name, args.hold, as_name=args.as_name)
    lineage = rec.summary.get("lineage", {})
    print(f"restored {rec.name} (accuracy {rec.accuracy:.4f}, owner {rec.owner}, sha256 {rec.checksum[:12]}..., "
          f"parent {lineage.get('parent') or '-'}) into {zoo.uri}")
    return 0


# ---------------------------------------------------------------------------------------------- keeper team
def _cmd_team(args: argparse.Namespace) -> int:
    from keeper.store import ModelStore
    from keeper.teams import Access, new_secret

    store = ModelStore(zoo_uri(args), mode="read" if args.team_cmd == "ls" else "write")
    access = Access(store, ttl_s=0.0)
    if args.team_cmd == "ls":
        table = access.table
        if table is None:
            print(f"the zoo at {store.uri} has no teams: every client may read and write every model")
            return 0
        kept = (f"{table.retention_s:g} s" if table.retention_s is not None
                else "each client's retention_s (7 days by default)")
        print(f"teams of the zoo at {store.uri} (removed models held {kept}; registrations {table.rate_burst} at "
              f"once, then {table.rate_per_s:g}/s; outlier_above_gap {table.outlier_above_gap})")
        for name, e in sorted(table.teams.items()):
            print(f"  {name:24s} capacity_bytes {e.capacity_bytes if e.capacity_bytes is not None else '-'}  "
                  f"share {e.share:g}")
        return 0
    if args.team_cmd == "init":
        secret, made = _secret_from(args.operator_secret_file, new_secret)
        access.init_table(secret, client_of(args))
        print(f"the zoo at {store.uri} has teams now; its models so far belong to team 'default' (an operator changes "
              "them). Add teams with `keeper team add NAME` as the operator (--team operator)")
        if made:
            print(f"operator secret (shown once; keep it in a file only the operator reads): {secret}")
        return 0
    client = client_of(args)
    if args.team_cmd == "add":
        secret, made = _secret_from(args.team_secret_file, new_secret)
        access.change_table(client, lambda t: t.with_team(args.name, secret, capacity_bytes=args.capacity_bytes,
                                                          share=args.share), f"adding team {args.name!r}")
        print(f"team {args.name} is in the zoo at {store.uri}")
        if made:
            print(f"its secret (shown once; hand it to the team, e.g. as its KEEPER_SECRET_FILE): {secret}")
    elif args.team_cmd == "rm":
        access.change_table(client, lambda t: t.without_team(args.name), f"removing team {args.name!r}")
        print(f"team {args.name} is no longer in the zoo at {store.uri}; its models stay, changed by an operator")
    elif args.team_cmd == "policy":
        import dataclasses

        def change(t: Any) -> Any:
            out = {}
            if args.retention_s is not None:
                out["retention_s"] = args.retention_s
            if args.rate_burst is not None:
                out["rate_burst"] = args.rate_burst
            if args.rate_per_s is not None:
                out["rate_per_s"] = args.rate_per_s
            if args.outlier_above_gap is not None:
                out["outlier_above_gap"] = None if args.outlier_above_gap < 0 else args.outlier_above_gap
            return dataclasses.replace(t, **out)
        table = access.change_table(client, change, "changing the zoo's policy")
        print(f"policy of the zoo at {store.uri}: retention_s {table.retention_s}, rate {table.rate_burst} then "
              f"{table.rate_per_s:g}/s, outlier_above_gap {table.outlier_above_gap}")
    return 0


def _secret_from(path: str | None, make: Any) -> tuple[str, bool]:
    """A secret from ``path``, or a fresh one (then True)."""
    from keeper.teams import _read_secret

    return (_read_secret(path, "the secret file"), False) if path else (make(), True)


# ---------------------------------------------------------------------------------------------- the parsers
def _number(kind: type, low: float, what: str):
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not low <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} must be {what} >= {low:g}")
        return value
    return parse


def add_commands(sub: Any, seconds: Any) -> None:
    """Add ``zoo`` and ``team`` to the ``keeper`` command's subparsers (``seconds``: the argparse type of a
    number of seconds)."""
    z = sub.add_parser("zoo", help="list, inspect, remove, restore or update zoo models; the log; clean up",
                       description="The zoo's catalog, holding area and log. In a zoo with teams, writes need your "
                                   "team (--team, $KEEPER_TEAM) and its secret (--secret-file, $KEEPER_SECRET_FILE, "
                                   "$KEEPER_SECRET); only a model's team or an operator changes it.",
                       epilog="examples:\n"
                              "  keeper zoo ls ; keeper zoo info resnet-a\n"
                              "  keeper zoo rm resnet-a                     # held until its retention ends\n"
                              "  keeper zoo held ; keeper zoo restore resnet-a [--as resnet-a2]\n"
                              "  keeper zoo update resnet-a --accuracy 0.93 --private\n"
                              "  keeper zoo log --model resnet-a ; keeper zoo log --last 20 --json\n"
                              "  keeper zoo gc                              # expired holds, crash leftovers")
    zs = z.add_subparsers(dest="zoo_cmd", required=True, metavar="ACTION")
    zs.add_parser = functools.partial(zs.add_parser, formatter_class=z.formatter_class)
    ls = zs.add_parser("ls", help="list models (other teams' private ones left out)")
    ls.add_argument("--json", action="store_true", help="print the catalog records as a JSON list")
    info = zs.add_parser("info", help="show one model's catalog record")
    info.add_argument("name", help="the model's name in the zoo (as `keeper zoo ls` lists it)")
    rm = zs.add_parser("rm", help="remove a model: it is held (restorable) until its retention ends",
                       description="Move a model to the holding area, from where `keeper zoo restore` brings it "
                                   "back until `keeper zoo gc` deletes it once its retention has ended. In a zoo "
                                   "with teams only the model's team or an operator may.")
    rm.add_argument("name", help="the model's name in the zoo (as `keeper zoo ls` lists it)")
    rs = zs.add_parser("restore", help="bring a removed or evicted model back, with its lineage and statistics",
                       description="Restore a held model: the same record (weights hash, lineage, accuracy, hits). "
                                   "Refused when its name is live again (restore it --as another name).")
    rs.add_argument("name", help="the held model's name (as `keeper zoo held` lists it)")
    rs.add_argument("--hold", help="which hold of NAME (default: the latest)")
    rs.add_argument("--as", dest="as_name", metavar="NEW_NAME", help="restore under this name instead")
    up = zs.add_parser("update", help="change a model's accuracy or privacy (its team or an operator)")
    up.add_argument("name", help="the model's name in the zoo")
    up.add_argument("--accuracy", type=float, help="the new accuracy, a fraction in [0, 1]")
    up.add_argument("--private", dest="private", action="store_true", default=None,
                    help="only its team (and operators) may see it and warm from it")
    up.add_argument("--public", dest="private", action="store_false", help="every team may warm from it")
    held = zs.add_parser("held", help="list the removed and evicted models waiting for their retention to end")
    held.add_argument("--json", action="store_true", help="print the holds as a JSON list")
    lg = zs.add_parser("log", help="print the zoo's log: every registration, update, removal, eviction, restore",
                       description="The zoo's append-only log, oldest first: what was written, by which team and "
                                   "user, from which host and process. Damaged entries are skipped with a warning.")
    lg.add_argument("--model", help="only the entries of this model")
    lg.add_argument("--last", type=_number(int, 1, "a whole number"), help="only the last N entries")
    lg.add_argument("--since", type=seconds, metavar="SECONDS", help="only entries of the last SECONDS seconds")
    lg.add_argument("--json", action="store_true", help="print the entries as a JSON list")
    gc = zs.add_parser("gc", help="delete held models past their retention; remove what killed writers left",
                       description="Delete the held models whose retention has ended (the team table's retention, "
                                   "else --retention-s), the temp files of writers that are gone (never a running "
                                   "writer's) and the blobs no model references, once older than --min-age.")
    gc.add_argument("--min-age", type=seconds, default=3600.0, metavar="SECONDS",
                    help="spare unreferenced blobs younger than this: a registration in another process may still "
                         "be writing them")
    for q in (held, rm, gc):
        q.add_argument("--retention-s", type=seconds, metavar="SECONDS",
                       help="how long a zoo without a team table holds models (default: 7 days, as retention_s)")
    for q in (ls, info, rm, rs, up, held, lg, gc):
        q.add_argument("--zoo", help=ZOO_HELP)
    for q in (ls, info, rm, rs, up, held, lg, gc):
        client_options(q)
    z.set_defaults(fn=_cmd_zoo)

    t = sub.add_parser("team", help="the teams of a shared zoo: add, remove, list; the zoo's policy (operators)",
                       description="The operator's team table: each team's secret (stored as a salted hash), its "
                                   "byte budget and share. `init` turns a zoo without teams into one with teams; "
                                   "every later change needs the operator (--team operator with its secret).",
                       epilog="examples:\n"
                              "  keeper team init --operator-secret-file op.secret\n"
                              "  export KEEPER_TEAM=operator KEEPER_SECRET_FILE=op.secret\n"
                              "  keeper team add vision                     # prints the team's new secret once\n"
                              "  keeper team add audio --team-secret-file audio.secret --capacity-bytes 20000000000\n"
                              "  keeper team policy --retention-s 1209600 --rate-burst 200\n"
                              "  keeper team ls")
    ts = t.add_subparsers(dest="team_cmd", required=True, metavar="ACTION")
    ts.add_parser = functools.partial(ts.add_parser, formatter_class=t.formatter_class)
    init = ts.add_parser("init", help="give the zoo a team table and an operator secret")
    init.add_argument("--operator-secret-file", help="a file holding the operator's secret (default: a fresh one, "
                                                     "printed once)")
    add = ts.add_parser("add", help="add a team, or replace its secret or budget")
    add.add_argument("name", help="the team's name (e.g. vision)")
    add.add_argument("--team-secret-file", help="a file holding the team's secret (default: a fresh one, printed "
                                                "once; an existing team keeps its secret only if one is given)")
    add.add_argument("--capacity-bytes", type=_number(int, 0, "a whole number of bytes"),
                     help="the team's byte budget (default: only its share of the zoo's capacity_bytes)")
    add.add_argument("--share", type=_number(float, 0.0, "a number"), default=1.0,
                     help="the team's weight in dividing the zoo's capacity_bytes")
    rmt = ts.add_parser("rm", help="remove a team (its models stay, changed by an operator)")
    rmt.add_argument("name", help="the team's name")
    ls_t = ts.add_parser("ls", help="list the teams, their budgets and the zoo's policy (never a secret)")
    pol = ts.add_parser("policy", help="set the zoo's retention, registration rate and accuracy outlier rule")
    pol.add_argument("--retention-s", type=seconds, metavar="SECONDS", help="how long removed models are held")
    pol.add_argument("--rate-burst", type=_number(int, 1, "a whole number"),
                     help="registrations a team may send at once")
    pol.add_argument("--rate-per-s", type=_number(float, 0.0, "a number"), help="registrations per second after that")
    pol.add_argument("--outlier-above-gap", type=float, metavar="GAP",
                     help="how far above the best model of its architecture an accuracy may be (negative: no limit)")
    for q in (init, add, rmt, ls_t, pol):
        q.add_argument("--zoo", help=ZOO_HELP)
    for q in (add, rmt, pol):
        client_options(q)
    init.add_argument("--team", help="recorded in the log as who made the table (default: $KEEPER_TEAM)")
    t.set_defaults(fn=_cmd_team)
