"""Sources: what feeds a Session (this process, an agent elsewhere, a child, a watched process)."""
