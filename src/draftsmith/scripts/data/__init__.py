"""Data tools: `draftsmith data inspect` and `draftsmith data regenerate`."""
