"""Compiled EP kernels (Cython). Public API lives in :mod:`fastep`."""
