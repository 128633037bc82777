"""The ``keeper`` command line.

Exit codes: 0 success, 1 a keeper error (the message says what and how to fix it), 2 bad usage.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from pathlib import Path
from importlib.metadata import entry_points
from typing import Any, Sequence

from keeper.actors.cli import add_commands as service_commands
from keeper.errors import KeeperError
from keeper.zoo_cli import ZOO_HELP as _ZOO_HELP
from keeper.zoo_cli import add_commands as zoo_commands
from keeper.zoo_cli import client_of, client_options, zoo_uri

__all__ = ["main"]

_EPILOG = """examples:
  keeper register trained.onnx --accuracy 0.91 --name resnet-a
  keeper register graph.onnx --weights model.safetensors --accuracy 0.9   # any size: weights apart
  keeper register runs/ --accuracy-file accuracies.json      # a directory: every *.onnx in it
  keeper warm new.onnx -o new-warm.onnx --noise 0            # function-preserving where the architecture allows
  keeper warm graph.onnx -o warm.safetensors                 # any size: the warmed weights as safetensors
  keeper zoo ls ; keeper zoo info resnet-a ; keeper zoo rm resnet-a ; keeper zoo restore resnet-a
  keeper zoo log --last 20 ; keeper zoo held                 # who wrote what; what a restore can bring back
  keeper team init ; keeper team add vision --team operator  # a shared zoo: teams, secrets, budgets (operators)
  keeper serve --config configs/default.yaml ; keeper scale 4 ; keeper stats
  keeper demo                                                # small NAS on MNIST-1D, cold vs warm (bench extra)
  keeper doctor                                              # which kernels, versions and caches; why keeper is slow
"""

_REGISTER_EPILOG = """examples:
  keeper register trained.onnx --accuracy 0.91 --name resnet-a
  keeper register graph.onnx --weights model.safetensors --accuracy 0.9   # graph and weights apart
  keeper register runs/ --accuracy-file accuracies.json      # every *.onnx in runs/ (and its .safetensors)
  keeper register runs/ --accuracy 0.9                       # one accuracy for every file without an entry
accuracies.json maps a file name or stem to its accuracy: {"resnet-a.onnx": 0.91, "vgg-b": 0.88}
"""


def _zoo(args, mode: str):
    """The zoo, opened to ``mode``: "write" creates it when missing; "read" refuses a missing one."""
    from keeper.zoo import Zoo

    return Zoo(zoo_uri(args), mode=mode, client=client_of(args))


def _accuracy_file(path: str) -> dict:
    try:
        accs = json.loads(Path(path).read_text())
    except ValueError as exc:  # a JSON error is a user's typo, not a crash: no traceback
        raise KeeperError(f"register: --accuracy-file {path!r} is not valid JSON ({exc}); write an object such "
                          'as {"resnet-a.onnx": 0.91}') from None
    if not isinstance(accs, dict):
        raise KeeperError(f"register: --accuracy-file {path!r} holds a {type(accs).__name__}, not an object; "
                          'write an object such as {"resnet-a.onnx": 0.91}')
    return accs


def _cmd_register(args) -> int:
    from tqdm import tqdm

    path = Path(args.model)
    if path.is_dir():  # every argument checked before the zoo is opened (and perhaps created)
        files = sorted(path.glob("*.onnx"))
        if not files:
            raise KeeperError(f"register: no *.onnx files in directory {str(path)!r}")
        accs = _accuracy_file(args.accuracy_file) if args.accuracy_file else {}
        zoo = _zoo(args, "write")
        failed = 0
        for f in tqdm(files, desc="registering", unit="model", disable=args.quiet):
            acc = accs.get(f.name, accs.get(f.stem, args.accuracy))
            if acc is None:
                print(f"skipped {f.name}: no accuracy (give --accuracy or an entry in --accuracy-file)", file=sys.stderr)
                failed += 1
                continue
            try:
                sibling = f.with_suffix(".safetensors")  # a graph's weights kept apart, next to it
                before = {r.name: r for r in zoo}
                rec = zoo.register(f, acc, name=f.stem, weights=sibling if sibling.is_file() else None,
                                   alias=args.alias, update_accuracy=args.update_accuracy, team=args.owner,
                                   private=args.private)
                if not args.quiet:
                    tqdm.write(_outcome(rec, before))
            except KeeperError as exc:
                print(f"refused {f.name}: {exc}", file=sys.stderr)
                failed += 1
        print(f"{len(files) - failed} of {len(files)} registered into {zoo.uri}")
        return 1 if failed else 0
    _model_file(args.model, "register")
    if args.accuracy is None:
        raise KeeperError("register: --accuracy is required for a single model (a fraction in [0, 1])")
    if not 0.0 <= args.accuracy <= 1.0:
        raise KeeperError(f"register: --accuracy {args.accuracy!r} is outside [0, 1]; give a fraction (e.g. 0.93, "
                          "not 93 or nan)")
    weights = _weights_file(args.weights)
    zoo = _zoo(args, "write")
    before = {r.name: r for r in zoo}
    rec = zoo.register(path, args.accuracy, name=args.name, weights=weights, alias=args.alias,
                       update_accuracy=args.update_accuracy, team=args.owner, private=args.private)
    print(_outcome(rec, before, zoo.uri))
    return 0


def _outcome(rec, before: dict, uri: str | None = None) -> str:
    """What a registration did, given the zoo's records before it: registered, aliased, updated or nothing."""
    where = f" in {uri}" if uri else ""
    old = before.get(rec.name)
    if old is not None and old.accuracy != rec.accuracy:
        return f"updated {rec.name}: accuracy {old.accuracy:.4f} -> {rec.accuracy:.4f}{where}"
    if old is not None:
        return f"already registered as {rec.name} (accuracy {rec.accuracy:.4f}){where}; nothing changed"
    twin = next((r.name for r in before.values() if r.checksum == rec.checksum
                 and r.extra_checksums.get("weights.safetensors") == rec.extra_checksums.get("weights.safetensors")),
                None)
    what = f"registered {rec.name} (accuracy {rec.accuracy:.4f}, {rec.num_params} params, {rec.nbytes} bytes)"
    return (f"{what}, an alias of {twin} (stored once)" if twin else what) + (f" into {uri}" if uri else "")


def _weights_file(path: str | None) -> Path | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise KeeperError(f"--weights {path!r}: no such file; give the model's weights as a .safetensors file")
    return Path(path)


def _model_file(path: str, command: str) -> Path:
    if not Path(path).is_file():
        raise KeeperError(f"{command}: no file {path!r}; give the path of an .onnx file")
    return Path(path)


def _output_file(path: str) -> str:
    """``-o``'s path, checked before any work: a writable directory, and an .onnx or .safetensors name."""
    parent = Path(path).parent
    if not path.endswith((".onnx", ".safetensors")):
        raise KeeperError(f"warm: -o {path!r} must end in .onnx (the model with weights) or .safetensors (the "
                          "weights alone)")
    if not parent.is_dir():
        raise KeeperError(f"warm: -o {path!r}: directory {str(parent)!r} does not exist; create it or write "
                          "elsewhere")
    if not os.access(parent, os.W_OK) or Path(path).is_dir():
        raise KeeperError(f"warm: -o {path!r} cannot be written here; write elsewhere")
    return path


def _cmd_warm(args) -> int:
    import onnx

    model, weights, output = _model_file(args.model, "warm"), _weights_file(args.weights), _output_file(args.output)
    zoo = _zoo(args, "read")  # a read-only zoo warms too: its usage counts are best-effort
    as_safetensors = output.endswith(".safetensors")
    result = zoo.warm(model, noise=args.noise, weights=weights, out=output if as_safetensors else None)
    if result.parent is None:
        print(f"no parent: {result.reason}")
    else:
        print(f"parent {result.parent}  similarity {result.score:.4f}  structure {result.structure:.4f}  "
              f"preserved {'yes' if result.preserved else 'no'}")
        print(f"why: {result.reason}")
    if result.candidates:
        print("candidates (best ranked first): name, similarity, coverage, structure, fit, preserved, clean, accuracy")
        for c in result.candidates:
            print(f"  {c['name']:30s} {c['score']:.4f} {c['coverage']:.4f} {c['structure']:.4f} {c['fit']:.4f} "
                  f"{'yes' if c['preserved'] else 'no':3s} {'yes' if c['clean'] else 'no':3s} {c['accuracy']:.4f}")
    s = result.summary()
    print(f"tensors {s['tensors']}, from parent {s['from_parent']}; operators: "
          + ", ".join(f"{k} {v}" for k, v in s["operators"].items()))
    if args.verbose:
        for key, (src, op) in result.mapping.items():
            print(f"  {key:50s} <- {src or '-':50s} {op}")
    if not as_safetensors:
        onnx.save_model(result.to_onnx(), args.output)
    print(f"wrote {args.output}")
    if result.parent is not None and result.missing:
        print(f"{len(result.missing)} learned tensors are read by ops keeper has no rule for and keep the model's "
              f"own values: {', '.join(result.missing[:8])}{' ...' if len(result.missing) > 8 else ''}")
    if result.unset:
        print(f"{len(result.unset)} tensors get no value from the parent and the model came without weights; they "
              f"are zeros in {args.output}: initialise them yourself (first: {result.unset[0]})")
    return 0


def _non_negative(unit: str = "", note: str = ""):
    """An argparse type: a finite number >= 0 (``unit`` names it in messages, ``note`` says what 0 means)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number{unit}") from None
        if not 0 <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number{unit} >= 0{note}")
        return value
    return parse


_noise = _non_negative(note=" (0 keeps the parent's function)")
_seconds = _non_negative(unit=" of seconds")


def _plugin_commands(sub: Any) -> None:
    """Commands other packages add (entry point group ``keeper.commands``: a function taking the subparsers),
    such as ``keeper demo`` from keeper_bench. keeper itself never imports them."""
    for ep in entry_points(group="keeper.commands"):
        try:
            add = ep.load()
        except (ImportError, AttributeError) as exc:  # a plugin whose package is broken must not break keeper's own commands
            print(f"keeper: warning: command {ep.name!r} from {ep.value} could not be loaded ({exc})", file=sys.stderr)
            continue
        add(sub)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option's default shown, unless it has none (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and "default" not in text
        return f"{text} (default: %(default)s)" if shown and action.option_strings else text


def _parser() -> argparse.ArgumentParser:
    from keeper import __version__

    p = argparse.ArgumentParser(prog="keeper", description="Warm-start training from a zoo of trained models.",
                                epilog=_EPILOG, formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"keeper {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser = functools.partial(sub.add_parser, formatter_class=HelpFormatter)  # every command's help alike

    _register_command(sub)
    _warm_command(sub)
    zoo_commands(sub, _seconds)
    _doctor_command(sub)
    service_commands(sub)
    _plugin_commands(sub)
    return p


def _register_command(sub: Any) -> None:
    r = sub.add_parser("register", help="add trained ONNX model(s) with their accuracy to the zoo",
                       description="Add a trained model (ONNX with weights, or its graph with --weights) to the zoo.\n"
                                   "Identical content is stored once; accuracy outliers and bad names are refused.",
                       epilog=_REGISTER_EPILOG)
    r.add_argument("model", help="an .onnx file, or a directory of them")
    r.add_argument("--weights", help="the model's weights as .safetensors, when MODEL is its graph without them "
                                     "(any size; in a directory, NAME.safetensors beside NAME.onnx is used)")
    r.add_argument("--accuracy", type=float, help="final accuracy as a fraction in [0, 1]")
    r.add_argument("--accuracy-file", help="directory mode: JSON mapping file name (or stem) to accuracy")
    r.add_argument("--name", help="name in the zoo (default: file stem for directories, content hash otherwise)")
    r.add_argument("--alias", action="store_true",
                   help="list content that is already stored under NAME too (without it that is refused)")
    r.add_argument("--update-accuracy", action="store_true",
                   help="record a new accuracy for content already stored under its name (without it that is "
                        "refused)")
    r.add_argument("--private", action="store_true",
                   help="only your team (and operators) may see the model and warm from it")
    r.add_argument("--owner", metavar="TEAM",
                   help="the team the model belongs to (default: yours; only an operator registers for another)")
    client_options(r)
    r.add_argument("--zoo", help=_ZOO_HELP)
    r.add_argument("-q", "--quiet", action="store_true", help="directory mode: no progress bar or per-model lines")
    r.set_defaults(fn=_cmd_register)


def _warm_command(sub: Any) -> None:
    from keeper.warm import DEFAULT_NOISE

    w = sub.add_parser("warm", help="write a warm-started copy of a model, weights taken from the best zoo parent",
                       description="Find the zoo model that best covers MODEL (similarity x accuracy), transform its "
                                   "weights onto MODEL's architecture and write the result.")
    w.add_argument("model", help="the new model's .onnx (its own initial weights are kept where nothing is inherited)")
    w.add_argument("-o", "--output", required=True,
                   help="where to write the warmed model: .onnx (ONNX with weights, under 2 GiB), or .safetensors "
                        "(the warmed weights alone, written tensor by tensor: any size)")
    w.add_argument("--weights", help="MODEL's initial weights as .safetensors, when MODEL is its graph without them")
    w.add_argument("--noise", type=_noise, default=None,
                   help="relative std of symmetry-breaking noise (0 keeps the parent's function exactly; default: "
                        f"{DEFAULT_NOISE}, the zoo's setting)")
    w.add_argument("-v", "--verbose", action="store_true", help="print the provenance of every tensor")
    client_options(w)
    w.add_argument("--zoo", help=_ZOO_HELP)
    w.set_defaults(fn=_cmd_warm)


def _cmd_doctor(args) -> int:
    from keeper import doctor

    found = doctor.report(load_kernels=args.load_kernels)
    print(json.dumps(found, indent=1) if args.json else doctor.render(found))
    return 0


def _doctor_command(sub: Any) -> None:
    d = sub.add_parser("doctor", help="show the kernels, versions and caches in use, and what makes keeper slow here",
                       description="Which alignment kernels run (the C extension, or numba and whether this machine "
                                   "holds their compiled code), the versions of torch (and its GPUs), ONNX, Ray and "
                                   "the rest, keeper's caches on this machine, and what costs time here.")
    d.add_argument("--load-kernels", action="store_true",
                   help="compile (first time on this machine) or load the numba kernels now and say how long it "
                        "took; run once in an image build so no trial compiles them")
    d.add_argument("--json", action="store_true", help="print the findings as JSON")
    d.set_defaults(fn=_cmd_doctor)


class _StderrWarnings(logging.Handler):
    """keeper's warnings as ``keeper: warning: ...`` lines on the stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"keeper: warning: {record.getMessage()}", file=sys.stderr)


def _warnings_to_stderr() -> None:
    logger = logging.getLogger("keeper")
    if not any(isinstance(h, _StderrWarnings) for h in logger.handlers):
        logger.addHandler(_StderrWarnings(logging.WARNING))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _warnings_to_stderr()
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:  # the reader left (`keeper zoo ls --json | head -1`): end quietly, as a pipe expects
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    except KeeperError as exc:
        print(f"keeper: error: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"keeper: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
