"""The transcript area: runs, their append-only log, the window a turn feeds, summaries, forks,
tool-result clearing, and the turn itself (``turn``)."""
