def helper():
    raise RuntimeError("boom at import")


helper()
