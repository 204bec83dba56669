"""Output that does not pass through the script's sys.stdout: a forked DataLoader worker,
a spawned process (as mp.spawn's ranks), and a write to file descriptor 2 (as C code)."""

import multiprocessing
import os

import torch
from torch.utils.data import DataLoader, TensorDataset


def say_from_worker(worker_id):
    print(f"hello from loader worker {worker_id}", flush=True)


def say_from_spawned(rank):
    print(f"hello from spawned rank {rank}", flush=True)


if __name__ == "__main__":
    print("hello from the script")
    data = TensorDataset(torch.randn(8, 4))
    for _ in DataLoader(data, batch_size=4, num_workers=1, worker_init_fn=say_from_worker):
        pass
    child = multiprocessing.get_context("spawn").Process(target=say_from_spawned, args=(1,))
    child.start()
    child.join()
    os.write(2, b"hello from C code\n")
    print("the script ends")
