"""Checkpoint layouts: where the frameworks people train with leave a model's weights in a checkpoint folder, read
into one state_dict without running anyone's code.

Weight files, in order of preference within one folder (:data:`WEIGHT_FILES`):

- ``model.onnx``: keeper's own, ONNX with its weights; taken as is (no state_dict is read beside it).
- ``model.safetensors``: keeper's own, and Hugging Face ``save_pretrained`` / the Trainer's.
- ``model.safetensors.index.json``: a sharded ``save_pretrained``: the index and the shard files it names.
- ``pytorch_model.bin`` / ``pytorch_model.bin.index.json``: ``save_pretrained(safe_serialization=False)``.
- ``model.pt``: keeper's own and Ray Train's (``torch.save(model.state_dict(), ...)``), or a dict holding the
  state_dict under ``"model"``, ``"state_dict"`` or ``"model_state_dict"``.
- ``*.ckpt``: Lightning's (``ray.train.lightning.RayTrainReportCallback`` writes ``checkpoint.ckpt``): the
  ``"state_dict"`` inside it.

Folders, in order: the checkpoint's top; else its ``checkpoint-<step>/`` folders (the Hugging Face Trainer's; the
highest step when there are several); else ``checkpoint/`` (Ray Train's transformers callback).

Invariants:

- Only the weight files above are opened: ``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``,
  ``training_args.bin``, ``trainer_state.json`` and every other file are never read as weights.
- Every pickle is read with ``torch.load(weights_only=True)``: a checkpoint is never unpickled into code.
- A folder holding two weight files that disagree (other keys, shapes or values) is refused naming both; equal
  ones are read once. A sharded index names only files of its own folder, and every key it maps must be in its
  shard.
- Every failure is one :class:`~keeper.errors.CheckpointError` line naming the file and the fix; nothing is
  returned in part.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from keeper.errors import CheckpointError

__all__ = ["WEIGHT_FILES", "LOOKED_FOR", "Found", "find_weights", "read_state_dict", "nothing_found"]

#: The weight files keeper reads, in order of preference within one folder (``*.ckpt``: any Lightning file).
WEIGHT_FILES = ("model.onnx", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "model.pt", "*.ckpt")
#: Where they are looked for, in words.
LOOKED_FOR = (f"{', '.join(WEIGHT_FILES)} at the checkpoint's top, in a checkpoint-<step>/ folder or in "
              "checkpoint/")

_STATE_KEYS = ("model", "state_dict", "model_state_dict")  # where a dict saved as model.pt keeps its state_dict
_INDEX_CAP = 64 * 1024 * 1024  # bytes of a shard index read at most
_STEP = re.compile(r"checkpoint-(\d+)")


@dataclass(frozen=True)
class Found:
    """The weights of a checkpoint folder.

    Attributes:
        layout: whose layout it is, in words (``"Hugging Face Trainer"``, ``"Lightning"``...).
        source: the file read, relative to the checkpoint (``"checkpoint-16/model.safetensors"``).
        onnx: the model as ONNX with weights (``model.onnx``), else None.
        state: the state_dict (key -> CPU tensor), else None.
    """

    layout: str
    source: str
    onnx: bytes | None = None
    state: dict[str, torch.Tensor] | None = None


def find_weights(directory: str, what: str) -> Found | None:
    """The weights of the checkpoint in ``directory`` in any layout above, or None when it holds no weight file.

    Raises:
        CheckpointError: a weight file cannot be read, two disagree, or a sharded index is broken (one line, naming
            the file).
    """
    for folder, layout in _folders(directory):
        here = os.path.join(directory, folder)
        names = {n for n in os.listdir(here) if os.path.isfile(os.path.join(here, n))}
        present = [n for n in WEIGHT_FILES[:-1] if n in names] + sorted(n for n in names if n.endswith(".ckpt"))
        if not present:
            continue
        if present[0] == "model.onnx":
            with open(os.path.join(directory, folder, "model.onnx"), "rb") as f:
                return Found("keeper", _rel(folder, "model.onnx"), onnx=f.read())
        found = [(name, _READERS[_kind(name)](os.path.join(directory, folder, name), _rel(folder, name), what))
                 for name in present]
        first, state = found[0]
        for other, state2 in found[1:]:
            _agree(state, state2, _rel(folder, first), _rel(folder, other), what)
        return Found(_layout(layout, first), _rel(folder, first), state=state)
    return None


def read_state_dict(directory: str, what: str) -> dict[str, torch.Tensor] | None:
    """The state_dict of the checkpoint in ``directory`` (:func:`find_weights`); None when it holds none (no weight
    file, or ``model.onnx``, which its trainable restores itself)."""
    found = find_weights(directory, what)
    return None if found is None else found.state


def _folders(directory: str) -> list[tuple[str, str]]:
    """(folder relative to ``directory``, whose layout a weight file there is), in the order they are tried."""
    out = [("", "keeper")]
    steps = []
    for name in os.listdir(directory):
        m = _STEP.fullmatch(name)
        if m and os.path.isdir(os.path.join(directory, name)):
            steps.append((int(m.group(1)), name))
    out += [(name, "Hugging Face Trainer") for _, name in sorted(steps, reverse=True)[:1]]
    if os.path.isdir(os.path.join(directory, "checkpoint")):
        out.append(("checkpoint", "Ray Train transformers"))
    return out


def _layout(folder_layout: str, name: str) -> str:
    """Whose layout weight file ``name`` is, in a folder of ``folder_layout``."""
    if name.endswith(".ckpt"):
        return "Lightning"
    if folder_layout == "keeper" and (name.startswith("pytorch_model") or name.endswith(".index.json")):
        return "Hugging Face save_pretrained"
    return folder_layout


def _rel(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _kind(name: str) -> str:
    return "ckpt" if name.endswith(".ckpt") else name


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


def _safetensors(path: str, label: str, what: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as exc:  # the safetensors library raises its own types for a damaged file
        raise CheckpointError(f"{what}: {label} is not a readable safetensors file ({_one_line(exc)}); report the "
                          "checkpoint as the framework saved it") from None


def _pickle(path: str, label: str, what: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a file it cannot or will not read
        raise CheckpointError(f"{what}: {label} cannot be read with torch.load(weights_only=True) ({_one_line(exc)}); "
                          "keeper never unpickles code: save only tensors and plain values in it (e.g. "
                          "torch.save(model.state_dict(), ...))") from None


def _tensors(obj: Any, label: str, what: str, fix: str) -> dict[str, torch.Tensor]:
    if not isinstance(obj, dict) or not obj or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                       for k, v in obj.items()):
        raise CheckpointError(f"{what}: {label} holds {_describe(obj)}, not a state_dict of tensors; {fix}")
    return obj


def _describe(obj: Any) -> str:
    if isinstance(obj, dict):
        keys = [str(k) for k in list(obj)[:5]]
        return f"a dict of {len(obj)} entries ({', '.join(repr(k) for k in keys)}{', ...' if len(obj) > 5 else ''})"
    return f"a {type(obj).__name__}"


def _model_pt(path: str, label: str, what: str) -> dict[str, torch.Tensor]:
    obj = _pickle(path, label, what)
    if isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        obj = next((obj[k] for k in _STATE_KEYS if k in obj), obj)  # {"model": sd, "optimizer": ...}: sd only
    return _tensors(obj, label, what, "save it with torch.save(model.state_dict(), 'model.pt')")


def _bin(path: str, label: str, what: str) -> dict[str, torch.Tensor]:
    return _tensors(_pickle(path, label, what), label, what, "save the model with save_pretrained")


def _ckpt(path: str, label: str, what: str) -> dict[str, torch.Tensor]:
    obj = _pickle(path, label, what)
    if not isinstance(obj, dict) or "state_dict" not in obj:
        raise CheckpointError(f"{what}: {label} holds {_describe(obj)} without a 'state_dict' entry, which a Lightning "
                          "checkpoint keeps; report the file Lightning's Trainer saved (ray.train.lightning."
                          "RayTrainReportCallback writes checkpoint.ckpt)")
    return _tensors(obj["state_dict"], f"{label}'s 'state_dict'", what,
                    "report the file Lightning's Trainer saved")


def _index(read_shard: Callable[[str, str, str], dict]) -> Callable[[str, str, str], dict[str, torch.Tensor]]:
    """A reader of a sharded index (``{"weight_map": {key: shard file}}``) whose shards ``read_shard`` reads."""

    def read(path: str, label: str, what: str) -> dict[str, torch.Tensor]:
        folder, prefix = os.path.dirname(path), label[: len(label) - len(os.path.basename(path))]
        try:
            with open(path, "rb") as f:
                data = f.read(_INDEX_CAP + 1)
            weight_map = json.loads(data)["weight_map"] if len(data) <= _INDEX_CAP else None
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{what}: {label} is not a shard index with a 'weight_map' ({_one_line(exc)}); "
                              "report the folder save_pretrained wrote, whole") from None
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise CheckpointError(f"{what}: {label} has no 'weight_map' of tensor names to shard files (or is over "
                              f"{_INDEX_CAP} bytes); report the folder save_pretrained wrote, whole")
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if os.path.basename(shard) != shard or shard in (".", ".."):
                raise CheckpointError(f"{what}: {label} names shard {shard!r} outside its own folder; a shard index "
                                  "names files beside it only")
            if not os.path.isfile(os.path.join(folder, shard)):
                raise CheckpointError(f"{what}: {label} names shard {shard!r}, which is not in the checkpoint; report "
                                  "the folder save_pretrained wrote with every shard")
            tensors = read_shard(os.path.join(folder, shard), prefix + shard, what)
            for key in (k for k, s in weight_map.items() if s == shard):
                if key not in tensors:
                    raise CheckpointError(f"{what}: {label} puts {key!r} in {prefix + shard}, which does not hold it; "
                                      "report the folder save_pretrained wrote, unchanged")
                state[key] = tensors[key]
        return state

    return read


def _agree(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], name_a: str, name_b: str, what: str) -> None:
    """Nothing when ``a`` and ``b`` hold the same tensors; else CheckpointError naming both files."""
    only = sorted(set(a) ^ set(b))
    if only:
        where = name_a if only[0] in a else name_b
        why = f"{only[0]!r} is only in {where}"
    else:
        differ = next((k for k in a if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
                       or not torch.equal(a[k], b[k])), None)
        if differ is None:
            return
        why = f"{differ!r} differs"
    raise CheckpointError(f"{what}: {name_a} and {name_b} hold different weights ({why}); keep one weight file in the "
                      "reported checkpoint, the one of the trained model")


_READERS: dict[str, Callable[[str, str, str], dict[str, torch.Tensor]]] = {
    "model.safetensors": _safetensors,
    "model.safetensors.index.json": _index(_safetensors),
    "pytorch_model.bin": _bin,
    "pytorch_model.bin.index.json": _index(_bin),
    "model.pt": _model_pt,
    "ckpt": _ckpt,
}

# Files that point to a framework's layout when a checkpoint holds none of the weight files: (layout, file names,
# name prefixes and suffixes that point to it, where that layout keeps its weights)
_HINTS = (
    ("the Hugging Face Trainer's", {"trainer_state.json", "optimizer.pt", "scheduler.pt", "training_args.bin",
                                    "rng_state.pth"}, ("checkpoint-", "rng_state"),
     "model.safetensors or pytorch_model.bin in checkpoint-<step>/: report the folder the Trainer saved, whole"),
    ("Hugging Face save_pretrained's", {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "adapter_config.json"}, (),
     "model.safetensors (sharded: model.safetensors.index.json) or pytorch_model.bin beside config.json: report "
     "the folder model.save_pretrained(...) wrote"),
    ("Lightning's", {"hparams.yaml", "lightning_logs"}, (".ckpt",),
     "a .ckpt file holding a 'state_dict': report it with ray.train.lightning.RayTrainReportCallback"),
    ("keeper's own (Ray Train's)", set(), (".pt", ".pth", ".bin", ".safetensors", ".onnx"),
     "model.pt (torch.save(model.state_dict(), ...)), model.safetensors or model.onnx at the top of the folder "
     "passed to Checkpoint.from_directory"),
)


def nothing_found(directory: str, what: str) -> CheckpointError:
    """The error for a checkpoint holding no weight file: what it holds, what was looked for, and which
    framework's layout is closest (with where that layout keeps the weights)."""
    seen = _listing(directory)
    scores = [sum(1 for n in seen if os.path.basename(n) in names or any(
        os.path.basename(n).startswith(a) or n.endswith(a) for a in affixes)) for _, names, affixes, _ in _HINTS]
    best = max(range(len(_HINTS)), key=lambda i: (scores[i], -i)) if max(scores) else len(_HINTS) - 1
    layout, _, _, where = _HINTS[best]
    shown = ", ".join(seen[:10]) + (f" and {len(seen) - 10} more" if len(seen) > 10 else "") if seen else "nothing"
    return CheckpointError(f"{what}: the checkpoint holds no model weights keeper reads: it holds {shown}; keeper "
                           f"looks for {LOOKED_FOR}. Closest: {layout} layout, whose weights are {where}")


def _listing(directory: str) -> list[str]:
    """The checkpoint's files and folders, one level of folders deep (``folder/``, ``folder/file``)."""
    out = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            out.append(f"{name}/")
            out += [f"{name}/{sub}" for sub in sorted(os.listdir(path))]
        else:
            out.append(name)
    return out
