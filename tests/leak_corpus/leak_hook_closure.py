"""LEAK: a forward hook whose closure keeps every activation."""

from _common import STEPS, batch, model, train_step


def make_recorder():
    store = []

    def hook(module, inputs, output):
        store.append(output.detach().clone())

    return hook


model[1].register_forward_hook(make_recorder())
for _step in range(STEPS):
    train_step(*batch())
