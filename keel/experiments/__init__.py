"""Experiment analysis: specs, statistics from sufficient statistics, guardrails, drill-down, causal analysis."""
