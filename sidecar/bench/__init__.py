"""``context-sidecar bench``: measure any running sidecar with synthetic agent turns.

A host-side tool, like context_sidecar_client, which it calls through: nothing of the server imports it,
and it imports nothing of the sidecar but the client (matplotlib only for --plot). workload.py
makes the turns, run.py plays and times them, report.py prints, writes and draws what was
measured; command.py is the command line, progress.py its progress bar.
"""
