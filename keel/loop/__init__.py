"""The loop that keeps the served model fresh, as decisions — values computed from their arguments, table-tested,
turned into run requests and policy commits by thin sensors (the shape of keel/canary.py).

- ``retrain``: whether a drift report leads to a challenger, and on which months (one at a time, coalesced);
- ``gate``: whether a trained challenger is better than the champion on the newest labelled window it did not
  train on (a paired bootstrap of per-row loss, with a margin);
- ``freeze``: whether serving a drifted feature frozen is better than live (same test), each freeze's expiry, and
  which freezes a promotion makes unnecessary.
"""
