"""rlconnect.connectors.agent."""
