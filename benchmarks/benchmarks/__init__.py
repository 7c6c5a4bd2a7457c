"""asv suites of fastep (``asv run`` from ``benchmarks/``)."""

#: The options class of each engine, by engine class name.
_OPTIONS = {"DenseEP": "DenseEPOptions", "SparseEP": "SparseEPOptions", "LinearEP": "LinearEPOptions",
            "DenseStudentTEP": "StudentTEPOptions", "SparseStudentTEP": "StudentTEPOptions"}


def build_engine(module, name, *args, **options):
    """``module.<name>(*args, <Options>(**options))``; on commits before the engines took an
    options object (asv times older commits with these suites), ``module.<name>(*args, **options)``."""
    options_class = getattr(module, _OPTIONS[name], None)
    if options_class is None:
        return getattr(module, name)(*args, **options)
    return getattr(module, name)(*args, options_class(**options))
