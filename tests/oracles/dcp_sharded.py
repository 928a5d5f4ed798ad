# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: a DCP checkpoint saved by two ranks, as FSDP and TP shard it (torch alone; no torchtitan).

  dcp_sharded.py DIR
      Two processes (Gloo over a file rendezvous) save DTensors with torch.distributed.checkpoint.save: "rows"
      (6, 4) as Shard(0), "cols" (3, 5) as Shard(1) over the 2 ranks, "both" (5, 6) on a 2x1 mesh as (Shard(0),
      Shard(1)) - uneven where the dims do not split evenly - each holding arange of its size as float32, plus
      "step" (an int item). A reader must assemble each from its chunks.

The ranks are forked, not spawned: a spawned rank imports torch again (seconds of a 2-core CI machine each), a
forked one shares the parent's import. Nothing runs in the parent before the fork.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def save_rank(rank, folder, rendezvous):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    whole = {"rows": (6, 4), "cols": (3, 5), "both": (5, 6)}
    state = {k: torch.arange(a * b, dtype=torch.float32).reshape(a, b) for k, (a, b) in whole.items()}
    state["rows"] = distribute_tensor(state["rows"], mesh, [Shard(0)])
    state["cols"] = distribute_tensor(state["cols"], mesh, [Shard(1)])
    mesh2 = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    state["both"] = distribute_tensor(state["both"], mesh2, [Shard(0), Shard(1)])
    state["step"] = 7
    dcp.save(state, checkpoint_id=folder)
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {__doc__}")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(save_rank, args=(sys.argv[1], os.path.join(tmp, "rendezvous")), nprocs=2,
                           start_method="fork")
