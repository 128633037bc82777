"""``keeper serve | scale | stats | reload | stop``: operating the Ray service from a shell (added to ``keeper`` by keeper/cli.py).

Examples:
    keeper serve --config configs/default.yaml              # local Ray; serves until Ctrl-C
    keeper serve --config configs/default.yaml --address auto   # on a running cluster; returns, actors stay
    keeper scale 8 --address auto
    keeper stats --address auto
    keeper reload --address auto                            # take in models registered by others now
    keeper stop --address auto
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from keeper.errors import KeeperError

__all__ = ["add_commands"]


def _connect(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from keeper.actors.config import load_config

    overrides: dict[str, Any] = {}
    if getattr(args, "zoo", None):
        overrides["zoo"] = args.zoo
    if getattr(args, "matchers", None) is not None:
        overrides["matchers"] = args.matchers
    if args.namespace:
        overrides["namespace"] = args.namespace
    cfg = load_config(args.config, **overrides)
    if not ray.is_initialized():
        try:
            ray.init(address=args.address, namespace=cfg.namespace, include_dashboard=False,
                     log_to_driver=False)
        except ConnectionError as exc:
            raise KeeperError(f"no Ray cluster to join at --address {args.address!r} ({exc}); start the service "
                              "with `keeper serve` first, or give the address of the cluster it runs on") from None
    return {"config": cfg}


def _handle(args: argparse.Namespace):
    from keeper.actors.launcher import connect

    ctx = _connect(args)
    return connect(ctx["config"]), ctx["config"]


def _get(ref, handle, timeout_s: float):
    from keeper.actors.remote import Demand, get

    return get(ref, timeout_s, Demand("the keeper service's answer (timeouts.control_s)", actor=handle))


def _cmd_serve(args: argparse.Namespace) -> int:
    from keeper.actors.launcher import find, start

    ctx = _connect(args)
    cfg = ctx["config"]
    handle = start(cfg)
    stats = _get(handle.stats.remote(), handle, cfg.timeouts.control_s)
    print(f"keeper serving {stats['models']} models from {stats['uri']} with {stats['matchers']} matchers "
          f"(actor {cfg.name!r}, namespace {cfg.namespace!r})", flush=True)
    block = args.block if args.block is not None else args.address is None
    if not block:
        return 0
    print("stop it with Ctrl-C, or `keeper stop` from another shell", flush=True)
    try:
        while True:  # a local Ray ends with this process: stay, and report now and then
            time.sleep(args.interval)
            if find(cfg) is None:
                print("keeper service stopped", flush=True)
                return 0
            s = _get(handle.stats.remote(), handle, cfg.timeouts.control_s)
            print(json.dumps({k: s[k] for k in ("models", "matchers", "clusters", "queries", "p50", "p99")}),
                  flush=True)
    except KeyboardInterrupt:
        return 0


def _cmd_scale(args: argparse.Namespace) -> int:
    handle, cfg = _handle(args)
    out = _get(handle.scale.remote(matchers=args.n), handle, cfg.timeouts.control_s)
    print(f"matchers: {out['matchers']}")
    return 0


def _cmd_reload(args: argparse.Namespace) -> int:
    handle, cfg = _handle(args)
    out = _get(handle.reload.remote(), handle, cfg.timeouts.register_s)
    print(f"keeper service {cfg.name!r} serves {out['models']} models")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from keeper.actors.launcher import shutdown

    cfg = _connect(args)["config"]
    killed = shutdown(cfg)
    if not killed:
        print(f"no keeper service {cfg.name!r} was running in Ray namespace {cfg.namespace!r}")
        return 0
    print(f"stopped the keeper service {cfg.name!r} (actors {', '.join(killed)}); the zoo stays in its store")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    handle, cfg = _handle(args)
    print(json.dumps(_get(handle.stats.remote(), handle, cfg.timeouts.control_s), indent=1, sort_keys=True,
                     default=str))
    return 0


def _count(low: int):
    """An argparse type: a whole number >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small; give at least {low}")
        return value
    return parse


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds > 0")
    return value


def _common(p: argparse.ArgumentParser, address: str | None) -> None:
    p.add_argument("--config", help="service YAML (default: built-in defaults, the same as configs/default.yaml)")
    p.add_argument("--address", default=address,
                   help="Ray address to join, e.g. 'auto' on a cluster node"
                        + (" (default: start a local Ray)" if address is None else f" (default: {address})"))
    p.add_argument("--namespace", help="Ray namespace of the service actors (default: from the config)")


def add_commands(subparsers: Any) -> None:
    """Add ``serve``, ``scale``, ``stats``, ``reload`` and ``stop`` to the ``keeper`` command's subparsers."""
    s = subparsers.add_parser("serve", help="start the keeper Ray service (or find the running one)",
                              description="Start the ZooManager, the Matcher pool and the front door as "
                                          "named detached Ray actors. Without --address a local Ray is started "
                                          "and the command stays until Ctrl-C; with --address it returns once "
                                          "the service answers.")
    _common(s, None)
    s.add_argument("--zoo", help="zoo location (directory or pyarrow.fs URI); overrides the config")
    s.add_argument("--matchers", type=_count(0), help="matcher count; overrides the config")
    s.add_argument("--block", dest="block", action="store_true", default=None,
                   help="stay in the foreground (default without --address)")
    s.add_argument("--detach", dest="block", action="store_false",
                   help="return once the service answers (default with --address)")
    s.add_argument("--interval", type=_interval, default=30.0, help="seconds between stats lines while blocking")
    s.set_defaults(fn=_cmd_serve)

    sc = subparsers.add_parser("scale", help="grow or shrink the running service's matcher pool")
    sc.add_argument("n", type=_count(0), help="matchers to keep (0: the front door scores alone)")
    _common(sc, "auto")
    sc.set_defaults(fn=_cmd_scale)

    st = subparsers.add_parser("stats", help="print the running service's figures as JSON")
    _common(st, "auto")
    st.set_defaults(fn=_cmd_stats)

    rl = subparsers.add_parser("reload", help="make the running service re-read its zoo now",
                               description="Re-read the zoo from the store now: models other processes registered, "
                                           "removed or re-scored. Without it the service takes in registrations "
                                           "and removals by others within 5 seconds (its catalog poll).")
    _common(rl, "auto")
    rl.set_defaults(fn=_cmd_reload)

    sp = subparsers.add_parser("stop", help="stop the running service (the zoo stays in its store)")
    _common(sp, "auto")
    sp.set_defaults(fn=_cmd_stop)
