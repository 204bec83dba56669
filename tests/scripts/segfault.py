"""Crashes the interpreter the hard way, as a broken C extension would."""

import os
import signal
import time

import torch

x = torch.ones(1000)
print("about to crash", flush=True)
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGSEGV)
