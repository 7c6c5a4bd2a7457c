"""The dense GP problems: binary EP on the full kernel matrix and the multinomial (nested EP) problem."""
