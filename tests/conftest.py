"""Shared test setup: this folder is on ``sys.path`` (pytest inserts a rootless conftest's
folder), so every test can ``from machine_speed import scaled, wait_until``."""
