"""A tiny GPT-2 trained by Hugging Face's ``Trainer``: a small config, nothing downloaded.

The Trainer reads tensor values before its first backward (its sampler's permutation as
a list, a count of the tokens in the batch), which fake tensors cannot give: the fake
step stands in for them. Options: --batch-size N (per device), --steps N.
"""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--out", default="hf_out")
args = p.parse_args()
torch.manual_seed(0)
config = GPT2Config(
    n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128,
    bos_token_id=0, eos_token_id=0,
)  # fmt: skip
model = GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    """Random token sequences of 128, their own labels (language modelling)."""

    def __len__(self) -> int:
        return 2048

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 1000, (128,))
        return {"input_ids": ids, "labels": ids}


training = TrainingArguments(
    output_dir=args.out, per_device_train_batch_size=args.batch_size, max_steps=args.steps,
    report_to=[], save_strategy="no", logging_steps=1000, use_cpu=True,
    dataloader_num_workers=0, disable_tqdm=True,
)  # fmt: skip
Trainer(model=model, args=training, train_dataset=Tokens()).train()
