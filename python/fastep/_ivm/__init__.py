"""The IVM's per-task problem: selection, refinement and the full-data kernel objective."""
