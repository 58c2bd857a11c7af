"""rlconnect: fast, safe RL experience collection on composable connector pipelines."""
