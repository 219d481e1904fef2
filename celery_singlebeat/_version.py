"""The release, in one place: the package, the replicas rows and the build read it."""

__version__ = "0.1.0"
