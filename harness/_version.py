"""The version of harness (read by the build too)."""

__version__ = "0.1.0"
