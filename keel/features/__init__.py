"""Features declared once (keel.features.definitions) and computed by two paths from that one definition:

- offline (keel.features.offline): a point-in-time correct table, one row per entity, the training source;
- online (keel.features.online): an online store holding the latest values per entity, read by
  ``get_online_features``.
"""
