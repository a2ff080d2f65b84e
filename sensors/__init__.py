"""Sensors and schedules that close the loop: landing and deliveries (build what arrived), drift (freeze features,
request retraining), canary (advance, promote or roll back a challenger), experiments' guardrails, metering,
alerting, the chaos drills' schedule and the watchdog. One factory per use case (usecase.py)."""
