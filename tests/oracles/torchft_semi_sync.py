# SPDX-License-Identifier: BSD-3-Clause
"""torchft's own LocalSGD / DiLoCo (torchft.local_sgd, the classes torchtitan's fault_tolerance.semi_sync_method
builds) on the model, data and optimizers of tests/train/semi_sync_test.cpp: two replica groups as threads, each
with a torchft Manager over Gloo, meeting through torchft's lighthouse. Writes the final parameters of replica 0
(w then b, float32, flattened) as raw little-endian bytes. Each METHOD ALPHA OUT_FILE triple is one run, with a
lighthouse of its own, one after the other in this process (torch and torchft are imported once).

usage: torchft_semi_sync.py STEPS SYNC_STEPS METHOD(local_sgd|diloco) ALPHA OUT_FILE [METHOD ALPHA OUT_FILE ...]"""
import sys
import threading
from datetime import timedelta

import torch
from torch import nn
from torch.distributed import TCPStore
from torchft import local_sgd
from torchft._torchft import LighthouseServer
from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo

INNER_LR = 0.05


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.cos(torch.arange(12, dtype=torch.float32).view(4, 3) * 0.5) * 0.3)
        self.b = nn.Parameter(torch.zeros(3, dtype=torch.float32))


def batch(replica, step):
    i = torch.arange(1, 9, dtype=torch.float32).view(8, 1)
    j = torch.arange(2, 6, dtype=torch.float32).view(1, 4)
    x = torch.sin(i * j * 0.37 + 1.3 * step + 2.1 * replica)
    w_true = torch.sin(torch.arange(12, dtype=torch.float32).view(4, 3))
    return x, x.mm(w_true) + 0.3 * replica


def train(replica, lighthouse, method, steps, sync_steps, alpha, results, errors):
    try:
        model = Linear()
        inner = torch.optim.AdamW(model.parameters(), lr=INNER_LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timedelta(seconds=30)),
            min_replica_size=2,
            load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["optim"])),
            state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
            replica_id=str(replica),
            store_addr="localhost",
            store_port=store.port,
            rank=0,
            world_size=1,
            lighthouse_addr=lighthouse,
            timeout=timedelta(seconds=30),
            use_async_quorum=False,
            # Both start from the same weights; with init_sync the first quorum (at the first outer step) would
            # overwrite replica 1's inner steps with replica 0's state.
            init_sync=False,
        )
        if method == "diloco":
            outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)  # torchtitan's
            semi_sync = local_sgd.DiLoCo(manager, [model], inner, outer, sync_every=sync_steps,
                                         backup_device=torch.device("cpu"), pin_memory=False,
                                         fragment_update_alpha=alpha)
        else:
            semi_sync = local_sgd.LocalSGD(manager, model, inner, sync_every=sync_steps)
        with semi_sync:
            for step in range(1, steps + 1):
                x, y = batch(replica, step)
                inner.zero_grad()
                torch.nn.functional.mse_loss(x.mm(model.w) + model.b, y).backward()
                inner.step()  # the post-step hook runs the outer step every sync_steps steps
        results[replica] = torch.cat([model.w.detach().flatten(), model.b.detach().flatten()]).clone()
        manager.shutdown(wait=False)
    except Exception as e:  # reported by the main thread
        errors.append(f"replica {replica}: {e!r}")


def run(method, steps, sync_steps, alpha, out):
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=10000)
    results, errors = {}, []
    threads = [threading.Thread(target=train, args=(r, lighthouse.address(), method, steps, sync_steps, alpha,
                                                    results, errors)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lighthouse.shutdown()
    if errors:
        sys.exit("torchft_semi_sync.py: " + "; ".join(errors))
    # With fragment_update_alpha > 0 each keeps some of its own local parameters.
    if alpha == 0 and not torch.equal(results[0], results[1]):
        sys.exit("torchft_semi_sync.py: the two replicas ended with different parameters")
    with open(out, "wb") as f:
        f.write(results[0].numpy().tobytes())


def main():
    if len(sys.argv) < 6 or (len(sys.argv) - 3) % 3:
        sys.exit(__doc__)
    steps, sync_steps = int(sys.argv[1]), int(sys.argv[2])
    for i in range(3, len(sys.argv), 3):
        run(sys.argv[i], steps, sync_steps, float(sys.argv[i + 1]), sys.argv[i + 2])


if __name__ == "__main__":
    main()
