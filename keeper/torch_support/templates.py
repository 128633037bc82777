"""Architecture templates: a module's graph without parameter values plus its ONNX-to-state_dict map, and where
they are kept.

A template is kilobytes whatever the model's size. :func:`fill_template` turns it and a state_dict back into ONNX
with weights, :func:`template_apart` into a graph plus weights apart (any size). ``warm_start`` leaves the trial's
template in the trial directory and in the zoo's store under a signature of the module's state_dict (its
floating-point keys and shapes), so the Tune callback turns a ``model.pt`` checkpoint into a zoo model wherever
``warm_start`` ran: a Tune trial, a Ray Train worker (whose run directory the Tune trial never sees), any process.

A template made with the module's state_dict records every key of it and which keys share a tensor, so a checkpoint
is read all or nothing (:mod:`keeper.torch_support.state_keys`): under an attribute prefix (Lightning's, DDP's),
with tied weights left out (Hugging Face's), and refused, naming the keys, when a key maps onto no key of the
module or a tensor the architecture reads is absent.

Invariants: a template is stored under the signature of the state_dict of the module it was exported from, and a
checkpoint of that module has the same signature (a collision between architectures with equal keys and shapes is
harmless: their templates can be filled with each other's state_dicts); a template is untrusted like any ONNX:
the zoo validates the filled model in full when it is registered.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import onnx
import torch

from keeper.errors import KeeperError
from keeper.onnx_safety import load_model
from keeper.onnx_weights import apart_specs, clear_data, write_weights
from keeper.store.stored import store_for
from keeper.torch_support.export import Exported
from keeper.torch_support.state_keys import map_state, prefix_parts
from keeper.torch_support.tensors import key_shapes, state_arrays, tied_keys

__all__ = ["architecture_template", "fill_template", "template_apart", "state_signature", "save_template",
           "find_template"]

_KEYS_PROP = "keeper.state_dict_keys"
_MODULE_PROP = "keeper.module_keys"  # every key of the module's state_dict, and the groups of tied keys


def architecture_template(exported: Exported, state: dict[str, Any] | None = None) -> bytes:
    """``exported`` without its parameter values: the architecture plus the ONNX-to-state_dict map, and, given
    the module's ``state`` (its ``state_dict()``), every key of it and its tied keys.

    Small (kilobytes) whatever the model's size; :func:`fill_template` turns it and a state_dict back into
    ONNX with weights. Initializers that hold a mapped parameter keep their dims and lose their data.
    """
    proto = load_model(exported.onnx, what="exported module")
    shapes = key_shapes(proto, exported.keys, exported.graph)
    for init in proto.graph.initializer:
        if init.name in exported.keys:
            clear_data(init)
    prop = proto.metadata_props.add()
    table = {k: [sd, how, list(shapes[k])] for k, (sd, how) in exported.keys.items()}
    prop.key, prop.value = _KEYS_PROP, json.dumps(table, sort_keys=True)
    if state is not None:
        tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
        groups = sorted({tuple(sorted(g)) for g in tied_keys(tensors).values()})
        prop = proto.metadata_props.add()
        prop.key, prop.value = _MODULE_PROP, json.dumps({"keys": list(state), "tied": groups})
    return proto.SerializeToString()


def fill_template(template: bytes, state: dict[str, Any], what: str = "checkpoint") -> bytes:
    """ONNX bytes with weights: ``template`` (from :func:`architecture_template`) filled with ``state``.

    The result is untrusted like any caller's ONNX: the zoo validates it in full when it is registered.

    Raises:
        KeeperError: ``template`` is not a keeper template, or ``state`` misses or mis-shapes a tensor.
    """
    proto, keys, shapes, module = _parse_template(template, what)
    state = _mapped(keys, module, state, what)
    return write_weights(proto, state_arrays(keys, shapes, state, what)).SerializeToString()


def template_apart(template: bytes, state: dict[str, Any], what: str = "checkpoint") -> tuple[bytes, dict]:
    """``template`` and ``state`` as a graph without weights plus its weights apart (initializer name -> array in
    the graph's dtype), for models of any size: nothing is serialised into ONNX.

    Raises:
        KeeperError: ``template`` is not a keeper template, or ``state`` misses or mis-shapes a tensor.
    """
    proto, keys, shapes, module = _parse_template(template, what)
    specs = apart_specs(proto)
    state = _mapped(keys, module, state, what)
    arrays = state_arrays(keys, shapes, state, what)
    return proto.SerializeToString(), {k: np.asarray(v).astype(specs[k][0], copy=False) if k in specs else v
                                       for k, v in arrays.items()}


def _mapped(keys: dict[str, tuple[str, str]], module: dict, state: dict[str, Any], what: str) -> dict[str, Any]:
    """``state`` keyed by the module's keys (:func:`~keeper.torch_support.state_keys.map_state`)."""
    needed = list(dict.fromkeys(sd for sd, _ in keys.values()))
    return map_state(state, needed, module.get("keys"), module.get("tied", ()), what)


def _parse_template(template: bytes, what: str) -> tuple[Any, dict[str, tuple[str, str]], dict[str, tuple], dict]:
    """(graph proto without keeper's entries, ONNX key -> (state_dict key, how), ONNX key -> shape, the module's
    keys ``{"keys": [...], "tied": [[...]]}`` or ``{}`` for a template that does not record them)."""
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(bytes(template))  # protobuf parsing executes and unpickles nothing
    except Exception as exc:
        raise KeeperError(f"{what}: the architecture template is not ONNX ({exc}); re-run warm_start") from None
    props = {p.key: p.value for p in proto.metadata_props}
    if _KEYS_PROP not in props:
        raise KeeperError(f"{what}: the architecture template has no {_KEYS_PROP!r} entry; it was not written by "
                          "keeper.torch_support.architecture_template")
    try:
        table = json.loads(props[_KEYS_PROP])
        keys = {k: (str(v[0]), str(v[1])) for k, v in table.items()}
        shapes = {k: tuple(int(d) for d in v[2]) for k, v in table.items()}
        module = json.loads(props.get(_MODULE_PROP, "{}"))
        module = {"keys": [str(k) for k in module["keys"]],
                  "tied": [tuple(str(k) for k in g) for g in module.get("tied", ())]} if module else {}
    except (ValueError, TypeError, IndexError, AttributeError, KeyError) as exc:
        raise KeeperError(f"{what}: the template's {_KEYS_PROP!r} entry is malformed ({exc}); re-run warm_start") \
            from None
    kept = [p for p in proto.metadata_props if p.key not in (_KEYS_PROP, _MODULE_PROP)]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    return proto, keys, shapes, module


def state_signature(state: dict[str, Any]) -> str:
    """Signature of a state_dict: its floating-point tensors' keys and shapes."""
    items = sorted((str(k), [int(d) for d in v.shape]) for k, v in state.items()
                   if isinstance(v, torch.Tensor) and torch.is_floating_point(v))
    return hashlib.blake2b(json.dumps(items).encode(), digest_size=20).hexdigest()


def save_template(uri: str, template: bytes, state: dict[str, Any]) -> None:
    """Store ``template`` in the zoo at ``uri`` under ``state``'s signature (once per architecture)."""
    store_for(uri).put_template(state_signature(state), template)


def find_template(uri: str, state: dict[str, Any]) -> bytes | None:
    """The template stored in the zoo at ``uri`` for ``state``'s architecture, or None: the whole state_dict's, else
    the one of its keys under an attribute prefix (a Lightning checkpoint of a LightningModule's ``self.model``)."""
    store = store_for(uri)
    for _, part in prefix_parts(state):
        found = store.get_template(state_signature(part)) if part else None
        if found is not None:
            return found
    return None
