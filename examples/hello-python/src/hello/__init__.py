"""Greets, and compares versions with `packaging`."""

from packaging.version import Version


def greet(name: str) -> str:
    return f"hello, {name}"


def newest(*versions: str) -> str:
    return str(max(Version(v) for v in versions))
