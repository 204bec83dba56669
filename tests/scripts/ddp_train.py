"""A two-rank DistributedDataParallel loop on CPU (gloo), for torchrun tests.

With --mib-per-sample M, each step also holds M MiB of activations per sample of its
--batch-size, so that a rank's memory is linear in its batch by construction (the
tuning tests of a job).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=0, help="0: until stopped")
parser.add_argument("--sleep", type=float, default=0.05)
parser.add_argument("--serve", action="store_true", help="call torchmem.serve() itself")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--mib-per-sample", type=int, default=0)
opts = parser.parse_args()
if opts.serve:
    import torchmem

    torchmem.serve()

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
rank_buffer = torch.zeros((rank + 1) * 256, 1024)  # rank 1 holds twice rank 0's bytes
print(f"rank {rank} of {dist.get_world_size()} in pid {os.getpid()}", flush=True)
step = 0
while opts.steps == 0 or step < opts.steps:
    step += 1
    held = torch.ones(opts.batch_size * opts.mib_per_sample, 256 * 1024)  # activations
    loss = model(torch.randn(opts.batch_size, 64)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    del held
    time.sleep(opts.sleep)
dist.destroy_process_group()
print(f"rank {rank} finished {step} steps", flush=True)
