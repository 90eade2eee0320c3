"""Model-based scorers (need torch + transformers: `pip install 'unirl-reward[models]'`)."""
