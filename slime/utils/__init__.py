"""Framework-wide utilities: arguments, Sample, RL math, data loading, logging, misc."""
