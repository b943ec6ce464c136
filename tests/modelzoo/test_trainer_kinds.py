"""`cszoo fit` on a small params file per kind of model beside GPT (tests/modelzoo/
test_trainer.py): each trains 2 steps on the CPU backend from data its own data processor
reads (written here), checkpoints at both, validates after the last, and a second run
resumed from the first checkpoint runs step 2 to the same loss, validation loss and
checkpoint. Every batch of a file holds the same samples: these data processors read
iterable datasets that a resumed run starts from their beginning (as on the real package;
the GPT test covers a dataloader that resumes where it was). Each takes a minute or more:
marked slow.
"""
import csv
import json
import math

import h5py
import numpy as np
import PIL.Image
import pytest
import torch
import yaml

import cerebras.pytorch as cstorch
from tests.modelzoo.test_trainer import _checkpoints, _cszoo_fit, _scalars

SEQ, PREDICTIONS, VOCAB, SAMPLES, BATCH = 16, 4, 100, 16, 4
IMAGE, CLASSES = 32, 4
RTOL = 1e-5


def _bert_csv(data_dir, seed):
    """What BertCSVDataProcessor reads: CSV files of features as Python lists (the masked
    positions, their labels and weights; the NSP label and segment ids), and `meta.dat`
    listing each file with its number of rows."""
    rng = np.random.default_rng(seed)
    data_dir.mkdir()
    names = ["input_ids", "attention_mask", "labels", "masked_lm_positions",
             "masked_lm_weights", "next_sentence_label", "token_type_ids"]
    with open(data_dir / "data-0.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, names)
        writer.writeheader()
        rows = []
        for _ in range(BATCH):
            positions = np.sort(rng.choice(np.arange(1, SEQ), PREDICTIONS, replace=False))
            rows.append(dict(
                input_ids=rng.integers(5, VOCAB, SEQ).tolist(), attention_mask=[1] * SEQ,
                labels=rng.integers(5, VOCAB, PREDICTIONS).tolist(),
                masked_lm_positions=positions.tolist(), masked_lm_weights=[1] * PREDICTIONS,
                next_sentence_label=int(rng.integers(0, 2)),
                token_type_ids=[0] * (SEQ // 2) + [1] * (SEQ // 2)))
        writer.writerows(rows * (SAMPLES // BATCH))
    (data_dir / "meta.dat").write_text(f"data-0.csv {SAMPLES}\n")


def _scalar_names(model_dir):
    return cstorch.utils.tensorboard.SummaryReader(str(model_dir / "events")).scalar_names()


def _t5_hdf5(data_dir, seed):
    """What T5HDF5DataProcessor reads: `.h5` files whose `data` holds (samples, features,
    length) int32, the features named by `data_params.json`, the count in `n_examples`."""
    rng = np.random.default_rng(seed)
    data_dir.mkdir()
    features = ["input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask",
                "labels"]
    tokens = np.tile(rng.integers(2, VOCAB, (BATCH, 3, SEQ)), (SAMPLES // BATCH, 1, 1))
    ones = np.ones((SAMPLES, SEQ))
    data = np.stack([tokens[:, 0], ones, tokens[:, 1], ones, tokens[:, 2]], axis=1)
    with h5py.File(data_dir / "data-0.h5", "w") as f:
        f.attrs["n_examples"] = SAMPLES
        f.create_dataset("data", data=data.astype(np.int32))
    (data_dir / "data_params.json").write_text(json.dumps({"features": features}))


def _imagenet_folder(data_dir, seed):
    """What ImageNet1KProcessor reads through `torchvision.datasets.ImageNet`: `meta.bin`
    (the class names of each WordNet id, and the validation images' ids) beside a `train`
    and a `val` folder of images, a sub-folder per WordNet id. Its plain DataLoader reads
    folders in order and starts again from the first image when resumed, so every batch
    holds the same images: one class's folder, images repeating every batch. Lossless PNGs,
    so that every run decodes the same pixels."""
    rng = np.random.default_rng(seed)
    wnids = [f"n{i:08d}" for i in range(CLASSES)]
    data_dir.mkdir()
    torch.save(({w: (f"class {i}",) for i, w in enumerate(wnids)}, []),
               data_dir / "meta.bin")
    batch = rng.integers(0, 256, (BATCH, IMAGE, IMAGE, 3), dtype=np.uint8)
    for split in ("train", "val"):
        folder = data_dir / split / wnids[0]
        folder.mkdir(parents=True)
        for i in range(SAMPLES):
            PIL.Image.fromarray(batch[i % BATCH]).save(folder / f"{i:03d}.png")


KINDS = {
    "bert": dict(
        model={"name": "bert", "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
               "num_heads": 2, "filter_size": 64, "max_position_embeddings": SEQ,
               "dropout_rate": 0.0, "attention_dropout_rate": 0.0},
        loader={"data_processor": "BertCSVDataProcessor"},
        write=_bert_csv),
    "t5": dict(
        model={"name": "t5", "src_vocab_size": VOCAB, "extra_ids": 0, "d_model": 32, "d_kv": 16,
               "num_heads": 2, "d_ff": 64, "encoder_num_hidden_layers": 2,
               "decoder_num_hidden_layers": 2, "src_max_position_embeddings": SEQ,
               "tgt_max_position_embeddings": SEQ, "dropout_rate": 0.0,
               "position_embedding_type": "relative"},
        loader={"data_processor": "T5HDF5DataProcessor"},
        write=_t5_hdf5),
    "vit": dict(
        model={"name": "vision_transformer", "num_classes": CLASSES, "hidden_size": 32,
               "num_hidden_layers": 2, "num_heads": 2, "filter_size": 64,
               "image_size": [IMAGE, IMAGE], "num_channels": 3, "patch_size": [8, 8],
               "position_embedding_type": "learned", "use_conv_patchified_embedding": True,
               "prepend_cls_token": True, "norm_first": True, "dropout_rate": 0.0,
               "embedding_dropout_rate": 0.0, "attention_dropout_rate": 0.0,
               "use_encoder_pooler_layer": False},
        loader={"data_processor": "ImageNet1KProcessor", "num_classes": CLASSES,
                "image_size": [IMAGE, IMAGE], "use_worker_cache": False,
                # torch refuses these two without worker processes
                "prefetch_factor": None, "persistent_workers": False,
                "transforms": [{"name": "to_tensor"},
                               {"name": "normalize", "mean": [0.5] * 3, "std": [0.5] * 3}]},
        split_folders=True,
        write=_imagenet_folder),
}


def _params(kind, tmp_path):
    spec = KINDS[kind]
    loaders = {}
    for split, seed in (("train", 0), ("val", 1)):
        if spec.get("split_folders"):   # one directory, a folder per split
            if split == "train":
                spec["write"](tmp_path / "images", seed)
            where = {"data_dir": str(tmp_path / "images"), "split": split}
        else:
            spec["write"](tmp_path / split, seed)
            where = {"data_dir": str(tmp_path / split)}
        loaders[split] = {**spec["loader"], **where, "batch_size": BATCH, "shuffle": False,
                          "num_workers": 0}
    params = {"trainer": {
        "init": {"backend": {"backend_type": "CPU"}, "seed": 1, "model": spec["model"],
                 "optimizer": {"AdamW": {"learning_rate": 1.0e-3, "weight_decay": 0.01}},
                 "loop": {"max_steps": 2, "eval_frequency": 2, "eval_steps": 1},
                 "checkpoint": {"steps": 1}, "logging": {"log_steps": 1}},
        "fit": {"train_dataloader": loaders["train"], "val_dataloader": loaders["val"]}}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cszoo_fit_trains_checkpoints_validates_and_resumes(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = _params(kind, tmp_path)
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    _cszoo_fit(params, "--model_dir", first)
    _cszoo_fit(params, "--model_dir", resumed, "--checkpoint_path", first / "checkpoint_1.mdl")

    losses = _scalars(first, "loss")
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
    assert _checkpoints(first) == [str(first / f"checkpoint_{s}.mdl") for s in (1, 2)]
    assert _checkpoints(resumed) == [str(resumed / "checkpoint_2.mdl")]
    again = _scalars(resumed, "loss")
    assert sorted(again) == [2]
    np.testing.assert_allclose(again[2], losses[2], rtol=RTOL)

    # Validation after step 2, in both runs, on the same weights: its loss and metrics.
    names = [n for n in _scalar_names(first) if n.startswith("validate_0/")
             and (n == "validate_0/loss" or "/eval/" in n)]
    assert "validate_0/loss" in names, names
    for name in names:
        value, again = _scalars(first, name), _scalars(resumed, name)
        assert sorted(value) == sorted(again) == [2], name
        assert math.isfinite(value[2]), name
        np.testing.assert_allclose(again[2], value[2], rtol=RTOL, err_msg=name)

    final, expected = (cstorch.load(str(d / "checkpoint_2.mdl")) for d in (resumed, first))
    assert final["global_step"] == expected["global_step"] == 2
    moved = cstorch.load(str(first / "checkpoint_1.mdl"))["model"]
    assert any(not torch.equal(v, moved[k]) for k, v in expected["model"].items())
    assert sorted(final["model"]) == sorted(expected["model"])
    for key, value in expected["model"].items():
        e, a = value.double().numpy(), final["model"][key].double().numpy()
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=RTOL * np.abs(e).max(), err_msg=key)
