"""Training and evaluation of a use case's model: deterministic LightGBM, metrics, and the quality gate."""
