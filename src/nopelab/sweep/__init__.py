"""Experiment grids on Ray: grid files, what a cell runs, and the engine."""
