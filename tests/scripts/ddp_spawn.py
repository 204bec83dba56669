"""PyTorch's DDP tutorial shape: mp.spawn starts the ranks, each passes its rank to
init_process_group (no RANK in the environment), gloo on CPU.

--steps N steps per rank (0: until the file --until exists).
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, world_size, port, steps, until):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    step = 0
    while (steps and step < steps) or (not steps and not os.path.exists(until)):
        optimizer.zero_grad()
        model(torch.randn(20, 10)).pow(2).mean().backward()
        optimizer.step()
        step += 1
        time.sleep(0.01)
    dist.destroy_process_group()
    print(f"rank {rank} finished {step} steps", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--until", default="")
    opts = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(2, port, opts.steps, opts.until), nprocs=2, join=True)
