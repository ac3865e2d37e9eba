"""Multi-process benchmarks' plumbing: programs started as one process per task, the launchers
that start and reap them, and the network namespaces that emulate two hosts."""
