"""The Student-t (robust) GP regression problem and its convergent double-loop fallback, dense and sparse."""
