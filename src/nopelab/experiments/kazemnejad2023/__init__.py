"""Kazemnejad et al. 2023, length generalisation on tasks: the encodings' accuracy past the
trained lengths, their ranks and mean reciprocal rank (``tasks``)."""
