"""Loops forever without an optimizer, a backward, a mark or a module call."""

import time

print("spinning", flush=True)
x = 0
while True:
    x += 1
    if x % 100000 == 0:
        time.sleep(0.001)
