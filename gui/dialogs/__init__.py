"""The dialogs: Attach, Sessions, Out of memory, census difference and leak settings."""
