"""Image defaults tied to the package version."""

from polyrl._version import __version__

DEFAULT_IMAGE = f"ghcr.io/polyrl/worker:{__version__}"
