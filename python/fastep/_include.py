"""``fastep.get_include()``: where downstream Cython finds fastep's ``.pxd`` files."""
from __future__ import annotations

import os

__all__ = ["get_include"]

_PXD = os.path.join("fastep", "_epcore", "sites.pxd")


def get_include() -> str:
    """Directory to pass to Cython's ``-I`` so that ``cimport fastep._epcore.sites`` etc. resolve.

    Like :func:`numpy.get_include`. For a normal installation this is the
    directory that holds the ``fastep`` package (the ``.pxd`` files are
    installed in ``fastep/_epcore/``). For an editable (meson-python)
    installation the ``.pxd`` files are not next to the Python sources; the
    build folder mirrors the package layout in ``include/`` beside the
    compiled ``fastep._epcore`` modules, and that folder is returned.

    Returns
    -------
    str
        An existing directory containing ``fastep/_epcore/sites.pxd``.

    Raises
    ------
    RuntimeError
        If neither location holds the ``.pxd`` files.

    Examples
    --------
    >>> import os
    >>> import fastep
    >>> include = fastep.get_include()
    >>> os.path.isfile(os.path.join(include, "fastep", "_epcore", "sites.pxd"))
    True

    From a shell: ``cython -I "$(python -c 'import fastep; print(fastep.get_include())')" mymodule.pyx``.
    """
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(package_parent, _PXD)):
        return package_parent
    from fastep._epcore import sites   # the compiled module: its folder is the build folder

    build_include = os.path.join(os.path.dirname(os.path.abspath(sites.__file__)), "include")
    if os.path.isfile(os.path.join(build_include, _PXD)):
        return build_include
    raise RuntimeError(f"fastep's .pxd files were found neither in {package_parent} nor in "
                       f"{build_include}; is fastep installed (pip install .)?")
