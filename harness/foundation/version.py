"""The harness's version, recorded with every run and plugin manifest."""

__version__ = "0.1.0"
