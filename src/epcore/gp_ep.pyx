# cython: language_level=3
"""Dense GP EP engine (placeholder until it lands)."""
