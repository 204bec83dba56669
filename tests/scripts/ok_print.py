import sys

print("hello from the script", sys.argv[1:])
print("to stderr", file=sys.stderr)
