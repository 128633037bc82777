"""Checkpoint layouts (keeper.torch_support.layouts) and the mapping of their keys onto a module's
(keeper.torch_support.state_keys), on files the frameworks themselves write: a real Hugging Face Trainer's
checkpoint-<step>/ folder, save_pretrained folders (whole, sharded, pytorch_model.bin, tied weights left out), a
real Lightning Trainer's .ckpt. Bad input: every refusal is one line naming the file, and nothing is returned."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from keeper.errors import KeeperError
from keeper.torch_support.export import export_graph
from keeper.torch_support.inputs import example_for
from keeper.torch_support.layouts import find_weights, nothing_found, read_state_dict
from keeper.torch_support.templates import architecture_template, template_apart
from keeper.tune_integration.checkpoint import checkpoint_model

transformers = pytest.importorskip("transformers")


def bert(hidden: int = 32, layers: int = 1, cls: str = "BertForSequenceClassification", seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=100, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=32)
    return getattr(transformers, cls)(config)


def template_of(module: torch.nn.Module, example=None) -> bytes:
    """The template warm_start writes for ``module`` (which makes its own example input when none is given)."""
    return architecture_template(export_graph(module, example_for(module, example)), module.state_dict())


def same_weights(module: torch.nn.Module, graph: bytes, weights: dict, example=None) -> bool:
    """Whether ``weights`` (from a checkpoint) are ``module``'s own (the template filled from its state_dict)."""
    want = template_apart(template_of(module, example), module.state_dict())[1]
    return set(want) == set(weights) and all(torch.equal(torch.as_tensor(want[k]), torch.as_tensor(weights[k]))
                                             for k in want)


def refused(directory, match: str, template: bytes | None = None) -> str:
    """The one-line refusal of reading ``directory``, which must name ``match``."""
    with pytest.raises(KeeperError) as info:
        checkpoint_model(str(directory), template, "trial t")
    text = str(info.value)
    assert "\n" not in text and match in text, text
    return text


# ------------------------------------------------------------------------------------------------ framework files

@pytest.fixture(scope="module")
def trainer_checkpoint(tmp_path_factory):
    """A real Trainer's output_dir after one step saved: checkpoint-1/ with the model, optimizer and scheduler."""
    out = tmp_path_factory.mktemp("hf")
    model = bert()

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"input_ids": torch.arange(8) + i, "labels": i % 2}

    args = transformers.TrainingArguments(output_dir=str(out), max_steps=1, save_strategy="steps", save_steps=1,
                                          per_device_train_batch_size=4, report_to=[], use_cpu=True,
                                          disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=Data()).train()
    return out, model


def test_the_trainers_checkpoint_folder_is_read_and_its_optimizer_never(trainer_checkpoint):
    out, model = trainer_checkpoint
    names = set(os.listdir(out / "checkpoint-1"))
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= names, names
    found = find_weights(str(out), "trial t")
    assert found.layout == "Hugging Face Trainer" and found.source == "checkpoint-1/model.safetensors"
    graph, weights = checkpoint_model(str(out), template_of(model), "trial t")
    assert same_weights(model, graph, weights)  # the trained weights, not the optimizer's moments


def test_a_checkpoint_of_optimizer_state_alone_is_refused_naming_the_trainers_layout(trainer_checkpoint, tmp_path):
    out, _ = trainer_checkpoint
    step = tmp_path / "checkpoint-1"
    step.mkdir()
    for name in ("optimizer.pt", "scheduler.pt", "trainer_state.json"):
        (step / name).write_bytes((out / "checkpoint-1" / name).read_bytes())
    text = refused(tmp_path, "checkpoint-1/optimizer.pt")
    assert "Closest: the Hugging Face Trainer's layout" in text and "model.safetensors" in text, text


@pytest.mark.parametrize("files, closest", [
    ({"config.json": "{}", "tokenizer.json": "{}"}, "Hugging Face save_pretrained's"),
    ({"weights.pth": "x"}, "keeper's own (Ray Train's)"),
    ({"hparams.yaml": "a: 1"}, "Lightning's"),
    ({}, "keeper's own (Ray Train's)"),
])
def test_a_checkpoint_without_weights_says_what_it_found_looked_for_and_the_closest_layout(tmp_path, files, closest):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    err = str(nothing_found(str(tmp_path), "trial t"))
    assert f"Closest: {closest} layout" in err and "model.safetensors.index.json" in err and "\n" not in err, err
    assert all(name in err for name in files) and (files or "holds nothing" in err), err


def test_save_pretrained_folders_whole_sharded_and_as_pytorch_model_bin(tmp_path):
    model = bert()
    template = template_of(model)
    model.save_pretrained(tmp_path / "whole")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    model.save_pretrained(tmp_path / "bin", safe_serialization=False)
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    for folder in ("whole", "sharded", "bin"):
        assert same_weights(model, *checkpoint_model(str(tmp_path / folder), template, "trial t")), folder


def test_tied_weights_left_out_by_save_pretrained_are_read_from_their_twin(tmp_path):
    model = bert(cls="BertForMaskedLM")
    model.save_pretrained(tmp_path)
    saved = read_state_dict(str(tmp_path), "trial t")
    assert "cls.predictions.decoder.weight" not in saved  # tied to the word embeddings, saved once
    assert same_weights(model, *checkpoint_model(str(tmp_path), template_of(model), "trial t"))


@pytest.fixture(scope="module")
def lightning_checkpoint(tmp_path_factory):
    """A real Lightning Trainer's .ckpt of a LightningModule whose network is its attribute ``net``."""
    pl = pytest.importorskip("lightning.pytorch")

    class Net(pl.LightningModule):
        def __init__(self, width: int = 16):
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))
            self.example_input_array = torch.zeros(1, 8)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    out = tmp_path_factory.mktemp("lightning")
    data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.arange(8) % 2)
    module = Net()
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    trainer.save_checkpoint(out / "checkpoint.ckpt")
    return out, module


def test_a_lightning_checkpoint_maps_onto_the_module_or_its_inner_network(lightning_checkpoint):
    out, module = lightning_checkpoint
    found = find_weights(str(out), "trial t")
    assert found.layout == "Lightning" and set(found.state) == {"net.0.weight", "net.0.bias", "net.2.weight",
                                                                  "net.2.bias"}
    # warm_start on the LightningModule itself (its example_input_array), or on its network (keys under "net.")
    for target, example in ((module, None), (module.net, torch.zeros(1, 8))):
        graph, weights = checkpoint_model(str(out), template_of(target, example), "trial t")
        assert same_weights(target, graph, weights, example), type(target).__name__


# ------------------------------------------------------------------------------------------------------ bad input

def test_two_weight_files_that_disagree_are_refused_naming_both(tmp_path):
    model = bert()
    model.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    assert same_weights(model, *checkpoint_model(str(tmp_path), template_of(model), "trial t"))  # equal: read once
    other = bert(seed=1).state_dict()
    torch.save(other, tmp_path / "pytorch_model.bin")
    text = refused(tmp_path, "model.safetensors and pytorch_model.bin hold different weights", template_of(model))
    assert "differs" in text, text


def test_a_shard_index_naming_a_missing_shard_is_refused_naming_both(tmp_path):
    model = bert()
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    refused(tmp_path, f"model.safetensors.index.json names shard {shard.name!r}, which is not in the checkpoint",
            template_of(model))


def test_a_shard_index_pointing_outside_its_folder_is_refused(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../elsewhere.bin"}}))
    refused(tmp_path, "names shard '../elsewhere.bin' outside its own folder")


def test_a_ckpt_without_state_dict_is_refused_naming_it(tmp_path):
    torch.save({"epoch": 1, "optimizer_states": []}, tmp_path / "checkpoint.ckpt")
    refused(tmp_path, "checkpoint.ckpt holds a dict of 2 entries ('epoch', 'optimizer_states') without a "
                      "'state_dict' entry")


class Payload:
    """A class ``weights_only=True`` refuses to unpickle (it could run code)."""

    def __reduce__(self):
        return (os.getcwd, ())


@pytest.mark.parametrize("name", ["model.pt", "pytorch_model.bin", "checkpoint.ckpt"])
def test_a_pickle_that_weights_only_refuses_is_refused_naming_it_and_never_run(tmp_path, name):
    torch.save({"state_dict": {"w": torch.zeros(1)}, "payload": Payload()}, tmp_path / name)
    text = refused(tmp_path, f"{name} cannot be read with torch.load(weights_only=True)")
    assert "never unpickles code" in text


def test_a_damaged_safetensors_file_is_refused_naming_it(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    refused(tmp_path, "model.safetensors is not a readable safetensors file")


def test_keys_that_do_not_map_are_refused_naming_the_first_ones_never_registered_in_part(tmp_path):
    model = bert()
    template = template_of(model)
    state = dict(model.state_dict())
    state["bert.encoder.layer.1.output.dense.weight"] = torch.zeros(32, 64)  # a layer this architecture lacks
    torch.save(state, tmp_path / "model.pt")
    refused(tmp_path, "1 of its 26 state_dict keys map onto no key of the module warm_start saw (first: "
                      "'bert.encoder.layer.1.output.dense.weight')", template)
    del state["bert.encoder.layer.1.output.dense.weight"], state["classifier.weight"]
    torch.save(state, tmp_path / "model.pt")
    refused(tmp_path, "lacks 1 of the", template)


def test_a_state_dict_under_a_wrappers_prefix_is_read_whole(tmp_path):
    model = bert()
    torch.save({"module." + k: v for k, v in model.state_dict().items()}, tmp_path / "model.pt")  # DDP's
    assert same_weights(model, *checkpoint_model(str(tmp_path), template_of(model), "trial t"))
    torch.save({"module." + k: v for k, v in list(model.state_dict().items())} | {"head.extra": torch.zeros(2)},
               tmp_path / "model.pt")
    refused(tmp_path, "under the prefix 'module.' (first: 'head.extra')", template_of(model))


def test_model_onnx_is_taken_as_is_and_nothing_else_is_read(tmp_path):
    Path(tmp_path / "model.onnx").write_bytes(b"onnx bytes")
    (tmp_path / "model.pt").write_bytes(b"not even a pickle")
    found = find_weights(str(tmp_path), "trial t")
    assert found.onnx == b"onnx bytes" and found.state is None
