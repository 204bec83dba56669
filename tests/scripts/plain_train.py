"""A training loop that knows nothing of torchmem (for injection tests)."""

import sys
import time

import torch

model = torch.nn.Linear(32, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
plain_buffer = torch.zeros(128, 1024)
print("training", flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "--block":
    time.sleep(600)  # blocked in a C call: no safe point for a pending call
while True:
    loss = model(torch.randn(4, 32)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.02)
