"""Sensors and schedules that close the loop (drift, feature health, canary, guardrails) live here.

The foundation has none yet: the drift sensor arrives with the features issue.
"""
