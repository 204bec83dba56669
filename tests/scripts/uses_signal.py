import signal

signal.signal(signal.SIGTERM, lambda *a: None)
print("installed a handler")
