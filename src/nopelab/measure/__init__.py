"""Activation statistics reduced on the fly, the metrics on them, and their reports."""
