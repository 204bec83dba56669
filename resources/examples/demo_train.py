"""torchmem's demo: a small CNN learns synthetic images (CPU, or a GPU when present).

Each class is a fixed random pattern and each image that pattern under heavy noise, so
the loss falls and the evaluation accuracy rises within the first epoch, as in a real
training run.

    python demo_train.py [--epochs 3] [--steps 100] [--batch-size 64] [--device auto]
    python demo_train.py --leak     # keeps every loss with its graph: memory grows per step

The leak is a classic one: a loss computed "for logging" is appended to a list as a
tensor, so its autograd graph, with every activation the graph saved, stays alive. The fix
is ``loss.item()``. Each step leaks a few MiB (about 1 GiB over the default 400 steps).

It marks each epoch with ``torchmem.mark`` when torchmem is installed, and runs an
evaluation pass at the end of each epoch (a short memory spike without gradients).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

try:
    import torchmem
except ImportError:  # the demo runs without torchmem too
    torchmem = None


def build_model(num_classes: int = 10) -> nn.Module:
    """A small convolutional classifier for 3x32x32 images."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.BatchNorm2d(128),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 256),
        nn.ReLU(),
        nn.Linear(256, num_classes),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps", type=int, default=100, help="steps per epoch")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps or xpu")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--leak",
        action="store_true",
        help="keep every loss with its graph (a leak of activations per step)",
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def pick_device(name: str) -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = pick_device(args.device)
    model = build_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    size = (args.batch_size, 3, args.image_size, args.image_size)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"demo: {params:,} parameters on {device}, batch {args.batch_size}, "
        f"{args.epochs} epochs x {args.steps} steps{' (leaking)' if args.leak else ''}"
    )
    # One fixed random pattern per class; an image is its class's pattern under noise.
    prototypes = torch.randn((10, *size[1:]), device=device)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, 10, (n,), device=device)
        return prototypes[labels] + 1.0 * torch.randn((n, *size[1:]), device=device), labels

    kept_losses = []  # the --leak bug: each loss keeps its whole graph alive
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        if torchmem is not None:
            torchmem.mark(f"epoch {epoch}")
        model.train()
        for step in range(1, args.steps + 1):
            images, labels = make_batch(args.batch_size)
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if args.leak:  # the bug: log a tensor with its graph; loss.item() would not leak
                kept_losses.append(loss_fn(model(images[:4]), labels[:4]))
            if step % 20 == 0:
                print(f"epoch {epoch} step {step:4d}  loss {loss.item():.4f}")
        model.eval()
        with torch.no_grad():  # held-out images: fresh noise over the same patterns
            batch, truth = make_batch(args.batch_size * 4)
            accuracy = (model(batch).argmax(1) == truth).float().mean().item()
        print(f"epoch {epoch} done, eval accuracy {accuracy:.3f}")
    took = time.perf_counter() - started
    print(f"demo: finished {args.epochs * args.steps} steps in {took:.1f} s")


if __name__ == "__main__":
    main()
