"""rlconnect.episodes."""
