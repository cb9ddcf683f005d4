"""Tail sampling: which assembled traces are kept for Tempo and the embedded store."""
