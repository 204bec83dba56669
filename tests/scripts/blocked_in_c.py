"""A script blocked in a C call (time.sleep) that Python cannot interrupt."""

import sys
import time

print("blocked now", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 600)
print("woke up", flush=True)
