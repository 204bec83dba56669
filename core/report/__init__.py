"""What a run, a recording or a search comes to, as data: the summaries ``--summary``,
``torchmem report`` and the window's exports write, and the CSV of a recording.

A library layer: the command line prints these and the window saves them; neither
builds them itself (``torchmem.cli`` only parses arguments and prints).
"""
