"""rlconnect.envs."""
