"""LEAK: a trainer that keeps a copy of every gradient in an attribute."""

from _common import STEPS, batch, model, train_step


class Trainer:
    def __init__(self):
        self.grad_history = []

    def step(self, x, y):
        train_step(x, y)
        self.grad_history.append(model[0].weight.grad.repeat(3, 1))  # 3 MiB per step


trainer = Trainer()
for _step in range(STEPS):
    trainer.step(*batch())
