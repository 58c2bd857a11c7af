"""rlconnect.policy."""
