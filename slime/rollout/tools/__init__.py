"""Tools for multi-turn (agentic) rollouts: `sandbox.Sandbox` runs untrusted tool code."""
