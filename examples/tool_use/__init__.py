"""Multi-turn tool use: a calculator the model calls inside its response."""
