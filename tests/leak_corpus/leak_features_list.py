"""LEAK: hidden features appended to a list without .detach()."""

from _common import STEPS, batch, model, train_step

features = []
for _step in range(STEPS):
    x, y = batch()
    hidden = model[1](model[0](x))
    features.append(hidden)  # the bug: keeps a [512, 1024] tensor (2 MiB) with its graph
    train_step(x, y)
