"""Metering, cost and budgets: who used what, and what it cost.

- ``compute``: Triton's own per-version compute statistics, sampled by the gateway into ``serving/compute/``; the
  deltas between samples are the model compute seconds of each interval.
- ``usage``: per tenant × model version × day (× the price table in force): requests, rows scored, answers by
  outcome, gateway time, and compute seconds attributed to tenants by their share of the rows scored.
- ``cost``: usage × the ``cost`` policy in force when each request was answered (each exposure record names the
  policy-store version it was served under).
- ``budget``: per-tenant budgets (``budget`` policy type): the decision — ok, soft (alert) or hard (429
  ``budget_exceeded``) — as a value, before any gateway acts on it.

Pure functions over records and frames; the I/O shells (``read_usage``) read the gateway's logs and the policy store.
"""
