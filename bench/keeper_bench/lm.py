"""A language-modelling workload that ships offline: the Python standard library's own source, read as bytes.

- Corpus (:func:`stdlib_corpus`): a fixed list of standard-library modules (:data:`CORPUS_FILES`), read from
  ``sysconfig.get_paths()['stdlib']`` of the running interpreter, source and docstrings alike. The split is by
  file (every fifth file of the list is validation), so no validation text is a shifted copy of training text.
  Nothing is downloaded; the corpus's SHA-256 is recorded so a report names the exact text it trained on.
- Tokenizer (:class:`ByteTokenizer`): UTF-8 bytes, vocabulary 256; decode(encode(s)) == s for every str.
- Models (:func:`build`): GPT-2- and Llama-style causal LMs built from Hugging Face configs (``GPT2Config`` /
  ``LlamaConfig``, random initialisation, no hub), varying depth, width, heads, key-value heads (grouped-query
  attention, Llama) and FFN size; :func:`arrivals` is the architectures of an experiment in arrival order.
- Training (:func:`train`): AdamW on random windows of the training bytes, cosine-decayed learning rate over the
  budget, validation loss and next-token accuracy on fixed validation windows every ``eval_every`` steps.

Example:
    >>> corpus = stdlib_corpus()                                             # doctest: +SKIP
    >>> model = build(arrivals(2)[0])                                        # doctest: +SKIP
    >>> h = train(model, corpus, steps=400, eval_every=40)                   # doctest: +SKIP
    >>> keeper_bench.plateau.at_plateau(h.steps, h.losses)                   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sysconfig
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["CORPUS_FILES", "Corpus", "ByteTokenizer", "stdlib_corpus", "LM_FAMILIES", "sample_spec", "neighbours",
           "arrivals", "arch_label", "build", "example_input", "num_params", "CausalLM", "LmHistory", "train",
           "evaluate"]

#: Standard-library modules of the corpus, in order; present (as these single files) in CPython 3.9 to 3.13.
CORPUS_FILES: tuple[str, ...] = (
    "abc.py", "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "cmd.py", "codecs.py",
    "colorsys.py", "configparser.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "datetime.py",
    "difflib.py", "enum.py", "fnmatch.py", "fractions.py", "functools.py", "getopt.py", "gettext.py", "glob.py",
    "gzip.py", "heapq.py", "hmac.py", "inspect.py", "ipaddress.py", "keyword.py", "linecache.py", "locale.py",
    "operator.py", "optparse.py", "pickle.py", "pprint.py", "queue.py", "random.py", "sched.py", "secrets.py",
    "selectors.py", "shlex.py", "shutil.py", "socket.py", "statistics.py", "string.py", "subprocess.py",
    "tarfile.py", "tempfile.py", "textwrap.py", "threading.py", "tokenize.py", "trace.py", "traceback.py",
    "types.py", "typing.py", "uuid.py", "warnings.py", "weakref.py", "json/__init__.py", "json/decoder.py",
    "json/encoder.py", "email/message.py", "http/client.py", "urllib/parse.py", "collections/__init__.py",
    "unittest/case.py", "logging/__init__.py", "os.py",
)
#: Every ``_VALIDATION_EVERY``-th file of :data:`CORPUS_FILES` (1-based) is validation text.
_VALIDATION_EVERY = 5


@dataclass(frozen=True)
class Corpus:
    """Training and validation bytes, and the files each came from."""

    train: bytes
    validation: bytes
    train_files: tuple[str, ...]
    validation_files: tuple[str, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.train + b"\0" + self.validation).hexdigest()


def stdlib_corpus(stdlib: str | None = None, files: tuple[str, ...] = CORPUS_FILES) -> Corpus:
    """The corpus: ``files`` read from ``stdlib`` (the running interpreter's standard library when None), each
    file followed by a blank line; every fifth file is validation.

    Raises:
        FileNotFoundError: more than a quarter of ``files`` are missing (another layout than CPython's); the
            missing ones are named.
    """
    root = stdlib or sysconfig.get_paths()["stdlib"]
    train, val, tf, vf, missing = [], [], [], [], []
    for i, rel in enumerate(files):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            missing.append(rel)
            continue
        with open(path, "rb") as f:
            text = f.read() + b"\n\n"
        if (i + 1) % _VALIDATION_EVERY == 0:
            val.append(text)
            vf.append(rel)
        else:
            train.append(text)
            tf.append(rel)
    if len(missing) * 4 > len(files) or not val or not train:
        raise FileNotFoundError(f"stdlib_corpus: {len(missing)} of {len(files)} corpus files are missing under "
                                f"{root!r} (first: {missing[:5]}); pass stdlib= the directory holding CPython's "
                                "standard library sources")
    return Corpus(b"".join(train), b"".join(val), tuple(tf), tuple(vf))


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocabulary 256): lossless for every string, no training, nothing to download."""

    vocab_size = 256

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Any) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise ValueError(f"ByteTokenizer.decode: ids must lie in [0, 255], got [{arr.min()}, {arr.max()}]; "
                             "these are byte tokens")
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


# ------------------------------------------------------------------ architectures

LM_FAMILIES = ("gpt2", "llama")
_WIDTHS = (32, 48, 64)
_LAYERS = (1, 2, 3, 4)
_HEADS = (2, 4)
_FFN_MULT = (2, 3, 4)


def _valid(spec: dict) -> bool:
    return (spec["d_model"] in _WIDTHS and spec["layers"] in _LAYERS and spec["heads"] in _HEADS
            and spec["d_model"] % spec["heads"] == 0 and spec["heads"] % spec["kv_heads"] == 0
            and (spec["family"] == "llama" or spec["kv_heads"] == spec["heads"]) and spec["ffn"] >= spec["d_model"])


#: Widths a family's first architecture draws from. 32, so the catalogue's models (widths 32-48 in the default
#: 24 arrivals) are small enough that cold runs reach their plateau within budgets the default setting can afford
#: on 2 cores (calibration on cold runs only: with widths 48-64, 1,600 steps left about half the cold runs still
#: gaining over 1% in their last 20%, and 2,000 steps left the 3-layer width-48 Llama at 1.4%).
_FIRST_WIDTHS = (32,)


def sample_spec(rng: np.random.Generator, family: str) -> dict:
    """A family's first architecture: 2 layers, width from :data:`_FIRST_WIDTHS` (later arrivals grow or shrink
    from it)."""
    if family not in LM_FAMILIES:
        raise ValueError(f"sample_spec: unknown family {family!r}; expected one of {LM_FAMILIES}")
    d = int(rng.choice(_FIRST_WIDTHS))
    heads = int(rng.choice(_HEADS))
    kv = heads if family == "gpt2" else int(rng.choice([k for k in (1, 2, 4) if heads % k == 0]))
    return {"family": family, "d_model": d, "layers": 2, "heads": heads, "kv_heads": kv,
            "ffn": d * int(rng.choice(_FFN_MULT))}


def _moves(spec: dict) -> dict[str, list[dict]]:
    """Architectures one step from ``spec``, by kind of step."""
    out: dict[str, list[dict]] = {"width": [], "depth": [], "heads": [], "kv_heads": [], "ffn": []}

    def add(kind: str, **change):
        s = {**spec, **change}
        if _valid(s) and s != spec:
            out[kind].append(s)

    i = _WIDTHS.index(spec["d_model"])
    mult = max(1, round(spec["ffn"] / spec["d_model"]))
    for j in (i - 1, i + 1):
        if 0 <= j < len(_WIDTHS):
            add("width", d_model=_WIDTHS[j], ffn=_WIDTHS[j] * mult)
    for L in (spec["layers"] - 1, spec["layers"] + 1):
        add("depth", layers=L)
    for h in _HEADS:
        add("heads", heads=h, kv_heads=h if spec["family"] == "gpt2" else min(spec["kv_heads"], h))
    if spec["family"] == "llama":
        for k in (1, 2, 4):
            add("kv_heads", kv_heads=k)
    for m in _FFN_MULT:
        add("ffn", ffn=spec["d_model"] * m)
    return {k: v for k, v in out.items() if v}


def neighbours(spec: dict) -> list[dict]:
    """Architectures one step from ``spec``: width, depth, heads, key-value heads (Llama) or FFN size."""
    return [s for options in _moves(spec).values() for s in options]


def arrivals(n: int, seed: int = 0, families: tuple[str, ...] = LM_FAMILIES) -> list[dict]:
    """``n`` distinct architectures in arrival order, families interleaved: each family's first one sampled,
    later ones one step (:func:`neighbours`; the kind of step drawn first, so width steps are as likely as
    head or FFN steps) from an earlier one of the family, as an evolutionary search does."""
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    out: list[dict] = []
    pools: dict[str, list[dict]] = {f: [] for f in families}
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 200 * n:
            raise RuntimeError(f"arrivals: found only {len(out)} distinct architectures of {n}")
        fam = families[len(out) % len(families)]
        pool = pools[fam]
        if pool:
            moves = _moves(pool[int(rng.integers(len(pool)))])
            options = moves[sorted(moves)[int(rng.integers(len(moves)))]]  # a kind of step, then one of its steps
            spec = options[int(rng.integers(len(options)))]
        else:
            spec = sample_spec(rng, fam)
        key = json.dumps(spec, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        pool.append(spec)
        out.append(spec)
    return out


def arch_label(spec: dict) -> str:
    kv = f"/kv{spec['kv_heads']}" if spec["family"] == "llama" else ""
    return f"{spec['family']}:d{spec['d_model']}/L{spec['layers']}/h{spec['heads']}{kv}/f{spec['ffn']}"


def _transformers():
    import transformers

    return transformers


def _torch_module():
    import torch

    class CausalLM(torch.nn.Module):
        """A Hugging Face causal LM as ``ids -> logits`` (no cache, an all-ones attention mask: both exporters
        trace it as one graph)."""

        def __init__(self, hf: Any):
            super().__init__()
            self.hf = hf

        def forward(self, ids):
            return self.hf(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits

    return CausalLM


def CausalLM(hf: Any) -> Any:  # noqa: N802 - a factory that reads like the class it makes (torch imported lazily)
    """``hf`` (a ``*ForCausalLM``) wrapped as ``ids -> logits``."""
    return _torch_module()(hf)


def build(spec: dict, context: int = 64) -> Any:
    """The model of ``spec`` (random initialisation from the global torch RNG), dropout off."""
    if not _valid(spec) or spec.get("family") not in LM_FAMILIES:
        raise ValueError(f"build: invalid LM spec {spec!r}; d_model in {_WIDTHS}, layers in {_LAYERS}, heads in "
                         f"{_HEADS} dividing d_model, kv_heads dividing heads (equal to heads for gpt2)")
    tf = _transformers()
    if spec["family"] == "gpt2":
        cfg = tf.GPT2Config(vocab_size=256, n_positions=context, n_embd=spec["d_model"], n_layer=spec["layers"],
                            n_head=spec["heads"], n_inner=spec["ffn"], resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        hf = tf.GPT2LMHeadModel(cfg)
    else:
        cfg = tf.LlamaConfig(vocab_size=256, max_position_embeddings=context, hidden_size=spec["d_model"],
                             num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                             num_key_value_heads=spec["kv_heads"], intermediate_size=spec["ffn"],
                             tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
        hf = tf.LlamaForCausalLM(cfg)
    return CausalLM(hf)


def example_input(context: int = 64) -> Any:
    import torch

    return torch.zeros(1, context, dtype=torch.long)


def num_params(model: Any) -> int:
    return int(sum(p.numel() for p in model.parameters()))


# ------------------------------------------------------------------ training


@dataclass
class LmHistory:
    """What :func:`train` observed: the step after which each evaluation ran, validation loss (nats per byte) and
    next-token accuracy there, mean training loss since the previous evaluation."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def final_loss(self) -> float:
        return self.losses[-1]

    @property
    def final_accuracy(self) -> float:
        return self.accuracies[-1]


_ENCODED: dict[int, tuple[bytes, np.ndarray]] = {}


def _encoded(text: bytes) -> np.ndarray:
    """``ByteTokenizer().encode(text)``, kept per text (an evaluation runs 10+ times a trial; the training text is
    2 MB, 16 MB as int64)."""
    hit = _ENCODED.get(id(text))
    if hit is None or hit[0] is not text:
        if len(_ENCODED) >= 4:
            _ENCODED.clear()
        hit = _ENCODED[id(text)] = (text, ByteTokenizer().encode(text))
    return hit[1]


def _windows(data: np.ndarray, starts: np.ndarray, length: int):
    import torch

    idx = starts[:, None] + np.arange(length)[None, :]
    return torch.from_numpy(data[idx])


def evaluate(model: Any, corpus: Corpus, context: int = 64, windows: int = 96, batch_size: int = 32) -> tuple[float, float]:
    """(validation loss, next-token accuracy) of ``model`` in eval mode over ``windows`` evenly spaced windows of
    the validation bytes; the model's training mode is restored."""
    import torch

    data = _encoded(corpus.validation)
    starts = np.linspace(0, len(data) - context - 2, windows).astype(np.int64)
    was = model.training
    model.eval()
    total, correct, count = 0.0, 0, 0
    try:
        with torch.no_grad():
            for i in range(0, windows, batch_size):
                w = _windows(data, starts[i:i + batch_size], context + 1)
                logits = model(w[:, :-1])
                y = w[:, 1:]
                total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1),
                                                                 reduction="sum"))
                correct += int((logits.argmax(-1) == y).sum())
                count += y.numel()
    finally:
        model.train(was)
    return total / count, correct / count


def train(model: Any, corpus: Corpus, *, steps: int, eval_every: int, batch_size: int = 8, context: int = 64,
          lr: float = 3e-3, warmup: int = 20, seed: int = 0, eval_windows: int = 96,
          report: Callable[[dict], None] | None = None,
          lr_factor: Callable[[int], float] | None = None) -> LmHistory:
    """Train ``model`` in place: AdamW (weight decay 0.01), linear warm-up over ``warmup`` steps then cosine decay
    to zero at ``steps``, on windows of ``context + 1`` training bytes drawn from a generator seeded by ``seed``.
    Evaluates (:func:`evaluate`) every ``eval_every`` steps and after the last. ``lr_factor``: step (0-based) ->
    factor multiplied into that schedule (a warm start's recipe, ``WarmResult.recipe(steps).factor``)."""
    import torch

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or eval_every < 1:
        raise ValueError(f"train: steps and eval_every must be positive integers, got {steps!r}, {eval_every!r}")
    data = _encoded(corpus.train)
    rng = np.random.default_rng(seed)
    # fused: one kernel over all parameters (the same AdamW update; the per-tensor loop's Python overhead is
    # about a tenth of a step for models this small)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=True)

    extra = lr_factor or (lambda s: 1.0)

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup * extra(s)
        return 0.5 * (1.0 + math.cos(math.pi * min(s, steps) / steps)) * extra(s)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    h = LmHistory()
    start = time.perf_counter()
    running, count = 0.0, 0
    model.train()
    for step in range(1, steps + 1):
        w = _windows(data, rng.integers(0, len(data) - context - 1, batch_size), context + 1)
        logits = model(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        sched.step()
        running, count = running + loss.item(), count + 1
        if step % eval_every and step != steps:
            continue
        vl, va = evaluate(model, corpus, context, eval_windows)
        h.steps.append(step)
        h.losses.append(vl)
        h.accuracies.append(va)
        h.train_losses.append(running / count)
        running, count = 0.0, 0
        if report is not None:
            report({"step": step, "loss": vl, "accuracy": va})
    h.seconds = time.perf_counter() - start
    return h
