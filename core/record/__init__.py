"""Recorded sessions: every run written to disk as it happens, and read back.

``store`` is the file format (SQLite in WAL mode, one file per session), ``recorder``
writes a Session's events into it from a thread of its own, ``replay`` fills a fresh
Session from a file (so a recording is shown by the very views that showed it live), and
``library`` is the per-user folder of sessions with its size cap.
"""
