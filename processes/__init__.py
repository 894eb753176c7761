"""Processes: starting, stopping and accounting for child processes, and stopping on SIGTERM.

The ground floor: it imports nothing of the project.
`processes.children` starts a role as a child in a process group of its own,
stops groups with a grace period and measures the CPU they used (the
launchers and the shuffle follower); `processes.sigterm` turns SIGTERM into
an exception so that a program's clean-up runs (GTP, matches, the ladder,
the one-shot shuffle job); `processes.renamed` forwards the old ``python -m``
names of moved entry points.
"""
