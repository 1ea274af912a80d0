"""Rollout side: data sources, rollout and eval functions, reward hub, dynamic filters."""
