"""Training and evaluation of the flight-delay model: deterministic LightGBM, metrics, and the quality gate."""
