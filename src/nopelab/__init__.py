"""nopelab: where transformers without positional encodings keep position."""

__version__ = "0.1.0"
