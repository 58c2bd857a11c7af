"""rlconnect.connectors.action."""
