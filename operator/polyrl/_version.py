"""The single place the package version lives (read by hatchling and `polyrl --version`)."""

__version__ = "0.1.0"
