"""The tenant-events area: each tenant's kept events (memory.compacted) and live watches."""
