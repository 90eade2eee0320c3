"""Reward scorers, RewardService, and an HTTP reward server and client. Installs without torch."""

__version__ = "0.1.0"
