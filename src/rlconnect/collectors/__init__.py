"""rlconnect.collectors."""
