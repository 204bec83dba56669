"""A small transformer language model trained by Lightning's ``Trainer`` on CPU.

Lightning wraps the step in its own loop (closures, precision plugins, ``self.log`` of
the loss, a strategy that calls backward): what the fake step must see through. Options:
--batch-size N, --steps N, --out DIR (Lightning's logs and checkpoints go there).
"""

import argparse

import lightning as L
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--out", default="lightning_out")
args = p.parse_args()
VOCAB, LENGTH, WIDTH = 1000, 128, 128


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, their own targets shifted by one (language modelling)."""

    def __len__(self) -> int:
        return 2048

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (LENGTH + 1,))


class LanguageModel(L.LightningModule):
    """Two transformer layers of 128 over embeddings, a linear head, Adam."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(WIDTH, VOCAB)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        tokens, targets = batch[:, :-1], batch[:, 1:]
        mask = nn.Transformer.generate_square_subsequent_mask(LENGTH)
        logits = self.head(self.encoder(self.embed(tokens), mask=mask, is_causal=True))
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=args.batch_size, shuffle=True)
    trainer = L.Trainer(
        max_steps=args.steps, accelerator="cpu", devices=1, default_root_dir=args.out,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(LanguageModel(), loader)
