"""Keras sentiment-classification pipeline: ingest, tokenize, train, evaluate, compare, score."""

__version__ = "0.1.0"
