"""A checkpoint's state_dict keys mapped onto the keys of the module an architecture template was exported from.

Frameworks save a module's weights under other names than the module's own:

- an attribute prefix over every key: Lightning saves the LightningModule's state_dict, so a model ``warm_start``
  saw as the LightningModule's ``self.model`` is under ``model.``; DDP's wrapper adds ``module.``,
  ``torch.compile`` ``_orig_mod.``;
- tied weights saved once: Hugging Face's ``save_pretrained`` leaves out a weight tied to another (a language
  model head tied to the input embeddings), which is then read from the key it is tied to, as transformers does
  when it loads.

Invariant: the mapping is all or nothing. Every key of the checkpoint maps onto a key of the module (under one
prefix), and every key the architecture reads is present, itself or through a key tied to it; otherwise
:class:`~keeper.errors.KeeperError` names the first keys that did not map and nothing is returned. For templates
written before keeper recorded the module's keys, only the second half can be checked.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from keeper.errors import KeeperError

__all__ = ["map_state", "prefix_parts"]

_SHOWN = 3  # keys named in an error


def map_state(state: Mapping[str, Any], needed: Sequence[str], known: Iterable[str] | None,
              tied: Iterable[Sequence[str]], what: str) -> dict[str, Any]:
    """``state`` keyed by the module's own keys.

    Args:
        state: the checkpoint's state_dict.
        needed: the module's keys the architecture reads (the template's key table), in its order.
        known: every key of the module's state_dict, or None when the template does not record them.
        tied: groups of the module's keys that share one tensor.
        what: names the checkpoint in errors.

    Raises:
        KeeperError: a key of ``state`` maps onto no key of the module, or a needed key is absent.
    """
    known_set = set(known) if known is not None else set(needed)
    prefix = _prefix(state, known_set)
    mapped = {k[len(prefix):]: v for k, v in state.items()
              if k.startswith(prefix) and k[len(prefix):] in known_set}
    if known is not None and len(mapped) < len(state):
        off = [k for k in state if not (k.startswith(prefix) and k[len(prefix):] in known_set)]
        under = f" under the prefix {prefix!r}" if prefix else ""
        raise KeeperError(f"{what}: {len(off)} of its {len(state)} state_dict keys map onto no key of the module "
                          f"warm_start saw{under} (first: {_names(off)}); report a checkpoint of the model passed "
                          "to warm_start, or call warm_start on the module whose state_dict the checkpoint holds "
                          "(for Lightning, the LightningModule itself)")
    partners = {k: group for group in tied for k in group}
    missing = []
    for key in needed:
        if key in mapped:
            continue
        twin = next((t for t in partners.get(key, ()) if t in mapped), None)
        if twin is None:
            missing.append(key)
        else:
            mapped[key] = mapped[twin]
    if missing:
        raise KeeperError(f"{what}: the checkpoint lacks {len(missing)} of the {len(needed)} tensors the "
                          f"architecture reads (first: {_names(missing)}); report the whole state_dict of the "
                          "model passed to warm_start")
    return mapped


def prefix_parts(state: Mapping[str, Any], depth: int = 2, most: int = 16) -> list[tuple[str, dict[str, Any]]]:
    """``("", state)``, then ``state``'s keys under each attribute prefix of up to ``depth`` names (``"model."``,
    ``"model.net."``) with the prefix removed, the prefixes covering most keys first (at most ``most``): the
    state_dicts an architecture may have been saved as."""
    counts: Counter[str] = Counter()
    for key in state:
        parts = key.split(".")
        for n in range(1, min(depth, len(parts) - 1) + 1):
            counts[".".join(parts[:n]) + "."] += 1
    prefixes = sorted(counts, key=lambda p: (-counts[p], len(p), p))[:most]
    return [("", dict(state))] + [(p, {k[len(p):]: v for k, v in state.items() if k.startswith(p)})
                                  for p in prefixes]


def _prefix(state: Mapping[str, Any], known: set[str]) -> str:
    """The attribute prefix under which most of ``state``'s keys are module keys (``""`` on a tie)."""
    counts: Counter[str] = Counter()
    for key in state:
        if key in known:
            counts[""] += 1
        at = key.find(".")
        while at >= 0:
            if key[at + 1:] in known:
                counts[key[:at + 1]] += 1
            at = key.find(".", at + 1)
    if not counts:
        return ""
    return min(counts, key=lambda p: (-counts[p], len(p)))


def _names(keys: Sequence[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_SHOWN])
    return shown + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")
