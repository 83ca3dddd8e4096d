"""The installed distribution's version: `dispatcher.__version__`, `dispatcher --version`."""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "bucket-dispatcher"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
