"""LEAK: an evaluation loss summed without torch.no_grad(): every graph stays alive."""

from _common import STEPS, batch, model, nn, train_step

eval_total = 0
for _step in range(STEPS):
    train_step(*batch())
    x, y = batch()
    eval_total = eval_total + nn.functional.cross_entropy(model(x), y)  # the bug
