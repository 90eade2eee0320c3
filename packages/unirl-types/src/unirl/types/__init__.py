"""The pydantic Sample schema shared by every unirl package: samples, parts, segments, sampling params, advantages, reward wire schema, safe tensor codec."""

__version__ = "0.1.0"
