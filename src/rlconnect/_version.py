"""The version of rlconnect, in one place: the package, its files and its build read it here."""

__version__ = "0.1.0"
