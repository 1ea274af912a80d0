"""Launching real SGLang servers on GPUs and building their arguments."""
