"""Sensors that close the loop: drift (freeze features, request retraining) and canary (advance, promote or roll
back a challenger). Guardrails arrive with the experiments work."""
