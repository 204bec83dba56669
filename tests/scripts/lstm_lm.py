"""An LSTM language model trained the way PyTorch's word_language_model example trains:
batchified token streams, truncated backpropagation through time, gradient clipping, and
a manual SGD update of ``p.data`` (no optimizer), the loss read with ``.item()`` after
the update. Its batch option is ``--batch_size`` (underscore), as in that example.
"""

import argparse
import math

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=20)
p.add_argument("--bptt", type=int, default=35)
p.add_argument("--steps", type=int, default=50)
p.add_argument("--lr", type=float, default=20.0)
args = p.parse_args()

torch.manual_seed(0)
VOCAB, EMBED, HIDDEN = 2000, 128, 256
corpus = torch.randint(0, VOCAB, (200_000,))  # a token stream, as a tokenized text


def batchify(data: torch.Tensor, batch: int) -> torch.Tensor:
    columns = data.size(0) // batch
    return data[: columns * batch].view(batch, -1).t().contiguous()


class LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, EMBED)
        self.rnn = nn.LSTM(EMBED, HIDDEN, num_layers=2)
        self.decoder = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(output).view(-1, VOCAB), hidden


model = LanguageModel()
criterion = nn.CrossEntropyLoss()
train = batchify(corpus, args.batch_size)
hidden = (
    torch.zeros(2, args.batch_size, HIDDEN),
    torch.zeros(2, args.batch_size, HIDDEN),
)
total = 0.0
for step, i in enumerate(range(0, train.size(0) - 1, args.bptt)):
    if step >= args.steps:
        break
    length = min(args.bptt, train.size(0) - 1 - i)
    data, targets = train[i : i + length], train[i + 1 : i + 1 + length].reshape(-1)
    hidden = tuple(h.detach() for h in hidden)  # truncated backpropagation
    model.zero_grad()
    output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for param in model.parameters():
        param.data.add_(param.grad, alpha=-args.lr)
    total += loss.item()
print(f"ppl {math.exp(total / max(step, 1)):.1f}")
