"""A training loop whose memory is linear in the batch size, by construction: each step
holds ``batch`` MiB of activations (one float32 row of 256 Ki elements per sample).

Its largest batch under a budget is therefore known independently of any search.
Options: --batch-size N, --steps N, --fail-above N (raise a ValueError above that size,
as a script with a shape bug would), --quadratic (hold batch² / 64 MiB more: attention),
--eval (a forward without grad after each step, as a validation pass), --log-loss (print
the loss's value before backward: fake tensors have none), --select (keep the rows a
boolean mask picks: a shape that depends on values, which fake tensors cannot give),
--noise (hold 0 to 3 more 16 MiB blocks, chosen at random in each run, as glibc keeps or
returns freed 16 MiB tensors: identical runs then peak up to 48 MiB apart),
--ignore-batch (never read the batch size: 8 samples whatever it says).

It updates its weights by hand, as PyTorch's word_language_model example does, and never
builds a torch.optim optimizer: the first optimizer imports torch._dynamo (1.1-1.3 s on
the 2-core CI machine), which every trial of every tuning test would pay for nothing.
Its steps end at each backward call, as torchmem counts them in such scripts.
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--steps", type=int, default=100)
p.add_argument("--fail-above", type=int, default=0)
p.add_argument("--quadratic", action="store_true")
p.add_argument("--eval", action="store_true")
p.add_argument("--log-loss", action="store_true")
p.add_argument("--noise", action="store_true")
p.add_argument("--select", action="store_true")
p.add_argument("--ignore-batch", action="store_true")
args = p.parse_args()
if args.ignore_batch:
    args.batch_size = 8
if args.fail_above and args.batch_size > args.fail_above:
    raise ValueError(f"shape mismatch: batch {args.batch_size} does not divide the buckets")

torch.manual_seed(0)
model = nn.Linear(16, 1)
ROW = 256 * 1024  # float32: one MiB per sample
if args.noise:
    import random

    kept = torch.ones(16 * random.SystemRandom().randrange(4), ROW)
for _ in range(args.steps):
    activations = torch.ones(args.batch_size, ROW)
    extra = torch.ones(args.batch_size * args.batch_size // 64, ROW) if args.quadratic else None
    rows = activations[activations[:, 0] > 0] if args.select else activations
    loss = model(rows[:, :16]).pow(2).mean()
    if args.log_loss:
        print(f"loss {loss.item():.4f}")
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
    if args.eval:
        with torch.no_grad():
            model(activations[:, :16])
    del activations, extra, rows
