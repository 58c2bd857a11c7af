"""Shared test setup: this folder is on ``sys.path`` (pytest inserts a rootless conftest's
folder), so every test can ``from machine_speed import scaled, wait_until``.

Ray starts its worker processes (hence every remote runner) at niceness 15, below every
other process: beside a CPU-heavy neighbour they get almost no CPU, and a Ray test that
takes 7 s alone did not start its actors within 180 s. The tests' Ray clusters, which the
test process starts and whose workers inherit its environment, run their workers at the
test's own priority (``RAY_worker_niceness``, the setting Ray's job submission uses too).
"""

import os

os.environ.setdefault("RAY_worker_niceness", "0")
