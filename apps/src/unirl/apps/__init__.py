"""unirl apps: domain trainers, recipes, CLI and run reports."""

__version__ = "0.1.0"
