"""Experiment grids: grid files, what a cell runs, the engine, and the job runner under it."""
