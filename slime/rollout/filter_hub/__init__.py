"""Dynamic sampling filters and their output type."""
