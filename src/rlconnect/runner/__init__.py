"""rlconnect.runner."""
