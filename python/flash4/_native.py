"""Loads the compiled extension flash4._C with a helpful message when it is missing."""

try:
    from . import _C
except ImportError as error:  # pragma: no cover - only on a broken install
    raise ImportError(
        "flash4's compiled extension flash4._C could not be imported. Install the package with "
        "`pip install .` from the repository root (not by putting python/ on sys.path). "
        f"Original error: {error}"
    ) from error


def library_version() -> str:
    """Version string of the C++ library the extension was built with."""
    return _C.version()
