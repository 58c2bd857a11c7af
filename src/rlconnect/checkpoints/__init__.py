"""rlconnect.checkpoints."""
