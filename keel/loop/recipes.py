"""The names of the candidate recipes a drift decision can train (keel/loop/candidates.py builds them), on their own:
a use case's declaration validates its ``Loop.candidates`` against them without importing the statistics (scipy)
— the Flink environment imports use cases and has none."""

RECIPES = ("rolling", "expanding", "recency", "committee", "recalibrated")
