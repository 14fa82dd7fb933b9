"""The memory area: entries under a memory ref, their ranking index, and compaction."""
