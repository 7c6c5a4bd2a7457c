"""Memory known before it is spent: a fit's peak working memory, estimated from the problem's
size, against the memory available to the process.

The limit is the smallest of

- ``FASTEP_MAX_MEMORY`` (bytes, or with a suffix: ``"4G"``, ``"512M"``, ``"2.5GiB"``), a limit
  the user sets;
- the memory the system can still give (``MemAvailable`` of ``/proc/meminfo`` on Linux, else the
  physical memory);
- the process's address-space limit (``ulimit -v``, ``RLIMIT_AS``) less the address space in use;
- the control group's memory limit (``memory.max`` of cgroup v2, ``memory.limit_in_bytes`` of
  v1) less the group's usage.

An estimator whose working memory grows faster than its data (dense GP and Student-t GP:
O(n²); the multinomial model: O(c n²); the IVM: O(d n); the sparse GP: O(m n)) calls
:func:`check_memory` before its first large allocation and raises
:class:`~fastep.exceptions.MemoryLimitError` when the estimate exceeds the limit: the message
names both and the estimator to use instead. The coefficients of the estimates are measured
(peak resident memory of fits of several sizes, ``benchmarks/memory_estimate.py``).
"""
import os
import re

from .exceptions import MemoryLimitError

__all__ = ["memory_limit", "check_memory", "fits_in_memory", "concurrent_problems", "format_bytes", "dense_gp_bytes",
           "student_t_gp_bytes", "sparse_gp_bytes", "ivm_bytes", "ENVIRONMENT_VARIABLE"]

#: The environment variable that caps the memory a fit may plan to use.
ENVIRONMENT_VARIABLE = "FASTEP_MAX_MEMORY"

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1000, "KIB": 1024, "M": 1024 ** 2, "MB": 1000 ** 2,
          "MIB": 1024 ** 2, "G": 1024 ** 3, "GB": 1000 ** 3, "GIB": 1024 ** 3, "T": 1024 ** 4,
          "TB": 1000 ** 4, "TIB": 1024 ** 4}


def parse_bytes(text):
    """Bytes in ``"4G"``, ``"512 MiB"``, ``"1e9"`` (K/M/G/T alone are binary)."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be a number of bytes, optionally with a unit "
                         f"(K, M, G, T, KB, MiB, ...); got {text!r}")
    value = float(match.group(1)) * _UNITS[unit]
    if not value > 0:
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be > 0; got {text!r}")
    return int(value)


def format_bytes(value):
    """``value`` bytes in GiB or MiB, for messages."""
    if value >= 1024 ** 3:
        return f"{value / 1024 ** 3:.1f} GiB"
    return f"{value / 1024 ** 2:.0f} MiB"


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _proc_kilobytes(path, field):
    """``field: <n> kB`` of a /proc file, in bytes (None where there is no such file or field)."""
    text = _read(path)
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M) if text is not None else None
    return int(match.group(1)) * 1024 if match else None


def _system_available():
    available = _proc_kilobytes("/proc/meminfo", "MemAvailable")
    if available is not None:
        return available
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_left():
    try:
        import resource
    except ImportError:                           # not on POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = _proc_kilobytes("/proc/self/status", "VmSize") or 0
    return max(soft - used, 0)


def _cgroup_left():
    limit = _read("/sys/fs/cgroup/memory.max")
    usage = _read("/sys/fs/cgroup/memory.current")
    if limit is None:                             # cgroup v1
        limit = _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        usage = _read("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    if limit is None or limit.strip() == "max":
        return None
    try:
        value = int(limit)
    except ValueError:
        return None
    if value >= 1 << 60:                          # v1's "no limit"
        return None
    try:
        used = int(usage) if usage is not None else 0
    except ValueError:
        used = 0
    return max(value - used, 0)


def memory_limit():
    """``(bytes, source)``: the memory a fit may plan to use and where that limit comes from.

    ``(None, None)`` when nothing can be read (then no check is made).
    """
    candidates = []
    configured = os.environ.get(ENVIRONMENT_VARIABLE)
    if configured:
        candidates.append((parse_bytes(configured), f"{ENVIRONMENT_VARIABLE}={configured}"))
    for value, source in ((_system_available(), "the memory the system has available"),
                          (_address_space_left(), "the process's address-space limit (ulimit -v)"),
                          (_cgroup_left(), "the control group's memory limit")):
        if value is not None:
            candidates.append((value, source))
    if not candidates:
        return None, None
    return min(candidates, key=lambda pair: pair[0])


def concurrent_problems(n_jobs):
    """How many problems an estimator's ``n_jobs`` fits at a time (1 for ``None``)."""
    if n_jobs is None:
        return 1
    from .batch import effective_n_jobs
    return effective_n_jobs(n_jobs)


def fits_in_memory(estimate):
    """Whether ``estimate`` bytes are within :func:`memory_limit` (True when no limit is known)."""
    limit, _ = memory_limit()
    return limit is None or estimate <= limit


def check_memory(estimate, what, instead):
    """Raise :class:`~fastep.exceptions.MemoryLimitError` if ``estimate`` bytes exceed the limit.

    Parameters
    ----------
    estimate : int
        The fit's estimated peak working memory in bytes.
    what : str
        The fit, for the message (e.g. ``"GaussianProcessClassifier.fit on n = 40000 rows"``).
    instead : str
        What to use instead, for the message.
    """
    limit, source = memory_limit()
    if limit is None or estimate <= limit:
        return
    raise MemoryLimitError(
        f"{what} needs about {format_bytes(estimate)} of working memory, more than the "
        f"{format_bytes(limit)} available ({source}); nothing was allocated. {instead} "
        f"(set {ENVIRONMENT_VARIABLE} to change the limit fastep plans with)",
        estimate=estimate, limit=limit, source=source)


#: Resident memory of a fit beyond its n×n arrays, bytes: BLAS buffers and small arrays; a
#: learning fit also imports and runs the optimiser.
BASE_BYTES = 4 * 1024 ** 2
BASE_BYTES_LEARNING = 24 * 1024 ** 2
#: n×n float64 arrays live at a dense GP fit's peak: during EP, K, the posterior (or B's
#: factor) and the engine's work array, plus rounding of the allocator; learning adds one
#: ∂K/∂θ_j, its temporaries and the factor kept for the best point so far (measured).
DENSE_ARRAYS_FIXED = 3.0
DENSE_ARRAYS_LEARNING = 7.0
#: The multinomial model's n×n arrays per class (its per-class factors, posterior blocks and
#: work, measured with fixed hyperparameters); learning adds the dense model's increment.
MULTINOMIAL_ARRAYS_PER_CLASS = 6.2


def dense_gp_bytes(n, *, learning, n_problems=1, n_concurrent=1, n_classes_multinomial=0):
    """Estimated peak working memory, in bytes, of a dense GP fit on ``n`` rows.

    ``n_problems`` binary problems (one-vs-rest) fitted ``n_concurrent`` at a time, each
    keeping one n×n factor for prediction once fitted; or, with ``n_classes_multinomial`` = c,
    the multinomial model (c kernel-sized arrays per class).
    """
    square = 8.0 * float(n) * float(n)
    if n_classes_multinomial:
        arrays = MULTINOMIAL_ARRAYS_PER_CLASS * n_classes_multinomial
        if learning:
            arrays += DENSE_ARRAYS_LEARNING - DENSE_ARRAYS_FIXED
        return int((BASE_BYTES_LEARNING if learning else BASE_BYTES) + arrays * square)
    working = DENSE_ARRAYS_LEARNING if learning else DENSE_ARRAYS_FIXED
    concurrent = max(1, min(n_concurrent, n_problems))
    kept = max(n_problems - concurrent, 0)
    return int((BASE_BYTES_LEARNING if learning else BASE_BYTES) + (concurrent * working + kept) * square)


#: The dense Student-t model's n×n arrays (fractional EP keeps the kernel's factor, the
#: posterior, the cavity work and the step-halving's saved state); learning adds the dense
#: model's increment less the factor it shares (measured).
STUDENT_T_ARRAYS_FIXED = 5.5
STUDENT_T_ARRAYS_LEARNING = 7.5


def student_t_gp_bytes(n, *, learning):
    """Estimated peak working memory, in bytes, of a dense Student-t GP fit on ``n`` rows."""
    arrays = STUDENT_T_ARRAYS_LEARNING if learning else STUDENT_T_ARRAYS_FIXED
    return int((BASE_BYTES_LEARNING if learning else BASE_BYTES) + arrays * 8.0 * float(n) * float(n))


#: n×m float64 arrays live at a sparse GP fit's peak: K(X, Z), the projection and the
#: engine's work; learning adds one ∂K(X, Z)/∂θ_j at a time and the gradient's temporaries
#: (measured).
SPARSE_ARRAYS_FIXED = 3.0
#: The same when the inducing inputs are not k-means++'s (whose Lloyd steps hold an n×m
#: distance matrix beside the fit's arrays): the IVM's selection or explicit inputs (measured).
SPARSE_ARRAYS_FIXED_NO_KMEANS = 2.0
SPARSE_ARRAYS_LEARNING = 10.5
#: d×n float64 arrays of an IVM fit: the selection's M with fixed hyperparameters; learning on
#: all n points (``kernel_objective='full_data'``) runs the sparse engine with the active set as
#: inducing inputs (measured).
IVM_ARRAYS_FIXED = 1.1
IVM_ARRAYS_LEARNING = 11.0


def _per_row_bytes(n, width, arrays, base, n_problems, n_concurrent):
    concurrent = max(1, min(n_concurrent, n_problems))
    return int(base + concurrent * arrays * 8.0 * float(n) * float(width))


def sparse_gp_bytes(n, m, *, learning, n_problems=1, n_concurrent=1, kmeans=True):
    """Estimated peak working memory, in bytes, of a sparse GP fit on ``n`` rows with ``m``
    inducing inputs: O(n m), ``n_problems`` (one-vs-rest) fitted ``n_concurrent`` at a time;
    ``kmeans``: the inducing inputs are chosen by k-means++."""
    if learning:
        arrays = SPARSE_ARRAYS_LEARNING
    else:
        arrays = SPARSE_ARRAYS_FIXED if kmeans else SPARSE_ARRAYS_FIXED_NO_KMEANS
    # its choice of inducing inputs and the engine's start add a fixed amount
    return _per_row_bytes(n, m, arrays, BASE_BYTES_LEARNING, n_problems, n_concurrent)


def minibatch_sparse_bytes(n, m, *, batch_size, n_features, n_problems=1, n_concurrent=1,
                           per_point_sites=False, chunk_rows=1 << 16):
    """Estimated peak working memory, in bytes, of a minibatch sparse GP fit (no n × m array):
    the targets (n floats per problem), per-point sites if kept (2n floats), one chunk of rows
    read at a time, the minibatch's batch × m temporaries (about 8 of them while the evidence
    gradient is formed) and the m × m state (about 8 matrices)."""
    concurrent = max(1, min(n_concurrent, n_problems))
    per_problem = 8.0 * (n * (3 if per_point_sites else 1) + 8 * batch_size * m + 8 * m * m)
    chunk = 8.0 * min(n, chunk_rows) * (n_features + 1)
    return int(BASE_BYTES_LEARNING + chunk + concurrent * per_problem)


def ivm_bytes(n, d, *, learning, n_problems=1, n_concurrent=1):
    """Estimated peak working memory, in bytes, of an IVM fit on ``n`` rows with active sets of
    ``d`` points: O(n d); ``learning``: the kernel is learnt on all n points."""
    arrays = IVM_ARRAYS_LEARNING if learning else IVM_ARRAYS_FIXED
    return _per_row_bytes(n, d, arrays, BASE_BYTES_LEARNING if learning else BASE_BYTES, n_problems,
                          n_concurrent)
