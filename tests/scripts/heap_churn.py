"""Tensors of 1-8 MiB come and go with small survivors between them: after the first
free of a mmapped chunk, glibc serves them from its arenas and keeps them when freed."""

import torch

big = torch.empty(32 << 20, dtype=torch.uint8)  # freed: raises malloc's mmap threshold
del big
kept, live = [], []
for step in range(200):
    live.append(torch.ones(int(torch.randint(1 << 18, 1 << 21, ()).item())))  # 1-8 MiB
    if len(live) > 40:
        live.pop(0)
    if step % 10 == 0:
        kept.append(torch.ones(1 << 16))  # small survivors between them: fragmentation
print("done")
