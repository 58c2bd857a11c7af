"""rlconnect.connectors."""
