# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: torchtitan 0.2.2's checkpoints (torch.distributed.checkpoint, DCP) for titan-convert from-dcp / to-dcp.

  torchtitan_dcp.py train MODEL BATCHES OUT BEFORE AFTER
      MODEL llama3 | qwen3 (torchtitan's debugmodel flavor, the vocabulary of BATCHES). Trains BEFORE steps on
      BATCHES' windows 0..BEFORE-1 and saves with torchtitan's own CheckpointManager (keys "model" flattened,
      "optimizer", "lr_scheduler", "dataloader", "train_state") to OUT/checkpoint/step-BEFORE; then a fresh model,
      optimizer, schedule and loader resume from it through the same CheckpointManager and train AFTER more steps on
      windows 0..AFTER-1 (what a titan run resuming without torchtitan's loader state sees). Writes OUT/losses.json:
      {"before": [...], "after": [...]}.
  torchtitan_dcp.py check MODEL ORIGINAL BASE BATCHES OUT.json
      ORIGINAL: torchtitan's DCP step folder; BASE: a folder whose checkpoint/step-N is a DCP folder titan wrote
      (titan-convert to-dcp). Loads both with torch.distributed.checkpoint.load (FileSystemReader) into state dicts
      built from their own metadata and compares every item exactly (tensors bitwise, objects by ==), then resumes
      torchtitan's CheckpointManager from BASE (dataloader excluded). Writes OUT.json: {"items", "missing", "different",
      "step", "last_epoch"}.

One process on the CPU, no process group: DCP saves and loads without one (its no-dist path), and a single rank's
state dict holds every tensor whole, one chunk each. Training follows torchtitan's train_step on one rank: the
token-sum cross-entropy divided by the token count, clip_grad_norm_ at max_norm, optimizers.step(),
lr_schedulers.step().

BATCHES: a safetensors file with "input" and "labels" (T, B, S) int64 and "settings" (json in its metadata).
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import Stateful

from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import cross_entropy_loss
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.components.optimizer import build_optimizers
from torchtitan.config.job_config import Checkpoint, LRScheduler, Optimizer
from torchtitan.distributed.parallel_dims import ParallelDims


def read_batches(path):
    with safe_open(path, "pt") as f:
        settings = json.loads(f.metadata()["settings"])
        return f.get_tensor("input"), f.get_tensor("labels"), settings


class Windows(IterableDataset, Stateful):
    """The batch windows in order, one (B, S) pair per step, resumable by position as torchtitan's datasets are."""

    def __init__(self, inputs, labels):
        self.inputs, self.labels, self.index = inputs, labels, 0

    def __iter__(self):
        while self.index < len(self.inputs):
            i = self.index
            self.index += 1
            yield self.inputs[i], self.labels[i]

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


def build(model_name, settings, inputs, labels, folder, seed):
    torch.manual_seed(seed)
    if model_name == "llama3":
        from torchtitan.models.llama3 import Transformer, llama3_args as table
    else:
        from torchtitan.models.qwen3 import Qwen3Model as Transformer, qwen3_args as table
    import copy

    args = copy.deepcopy(table["debugmodel"])
    args.vocab_size = settings["vocab"]
    args.max_seq_len = settings["seq_len"]
    model = Transformer(args)
    with torch.no_grad():
        model.init_weights()
    model.train()
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    optimizers = build_optimizers(
        [model],
        Optimizer(name="AdamW", lr=settings["lr"], beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                  implementation="foreach"),
        dims,
    )
    schedulers = build_lr_schedulers(optimizers, LRScheduler(warmup_steps=settings["warmup_steps"]),
                                     settings["steps"])
    loader = ParallelAwareDataloader(Windows(inputs, labels), dp_rank=0, dp_world_size=1, batch_size=None)
    train_state = TrainState()
    checkpointer = CheckpointManager(
        dataloader=loader, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
        states={"train_state": train_state},
        checkpoint_config=Checkpoint(enable=True, folder="checkpoint", interval=1, keep_latest_k=0,
                                     last_save_model_only=False),
        sd_adapter=None, base_folder=folder)
    return model, optimizers, schedulers, loader, train_state, checkpointer


class TrainState(Stateful):
    """torchtitan's Trainer as its CheckpointManager sees it (train.py: {"step", "ntokens_seen"})."""

    def __init__(self):
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state):
        self.step, self.ntokens_seen = state["step"], state["ntokens_seen"]


def train_steps(model, optimizers, schedulers, loader, train_state, steps, max_norm):
    losses = []
    it = iter(loader)
    for _ in range(steps):
        x, y = next(it)
        optimizers.zero_grad()
        loss = cross_entropy_loss(model(x), y) / y.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
        optimizers.step()
        schedulers.step()
        train_state.step += 1
        train_state.ntokens_seen += y.numel()
        losses.append(loss.item())
    return losses


def train(model_name, batches, out, before, after):
    inputs, labels, settings = read_batches(batches)
    model, opt, sched, loader, ts, ckpt = build(model_name, settings, inputs, labels, out, seed=0)
    losses_before = train_steps(model, opt, sched, loader, ts, before, settings["max_norm"])
    ckpt.save(before, last_step=False)
    ckpt.close()
    # A resume: everything fresh (other weights), then the checkpoint; the loader restarts at window 0 as titan's.
    model, opt, sched, loader, ts, ckpt = build(model_name, settings, inputs, labels, out, seed=1)
    ckpt.exclude_from_loading = ["dataloader"]
    assert ckpt.load(step=before)
    assert ts.step == before, ts.step
    losses_after = train_steps(model, opt, sched, loader, ts, after, settings["max_norm"])
    ckpt.close()
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump({"before": losses_before, "after": losses_after}, f)


def read_all(folder):
    """Every item of a DCP folder by its flattened key, as torch.distributed.checkpoint.load gives it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(folder)
    metadata = reader.read_metadata()
    state = {}
    for key, meta in metadata.state_dict_metadata.items():
        if isinstance(meta, TensorStorageMetadata):
            state[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
        else:
            state[key] = 0  # a placeholder the item replaces
    planner = dcp.DefaultLoadPlanner(flatten_state_dict=False)
    dcp.load(state, storage_reader=reader, planner=planner)
    return planner.state_dict  # the planner's own dict took the objects


def same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    return type(a) is type(b) and a == b


def check(model_name, original, base, batches, out):
    want, got = read_all(original), read_all(os.path.join(base, "checkpoint", os.listdir(os.path.join(base, "checkpoint"))[0]))
    # torchtitan's data loader state is its own: titan does not write it.
    keys = [k for k in want if not k.startswith("dataloader.")]
    result = {"items": len(keys), "missing": [k for k in keys if k not in got],
              "different": [k for k in keys if k in got and not same(want[k], got[k])][:20]}
    inputs, labels, settings = read_batches(batches)
    model, opt, sched, loader, ts, ckpt = build(model_name, settings, inputs, labels, base, seed=1)
    ckpt.exclude_from_loading = ["dataloader"]
    assert ckpt.load()
    result.update(step=ts.step, last_epoch=sched.schedulers[0].last_epoch)
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "train":
        train(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    else:
        check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])
