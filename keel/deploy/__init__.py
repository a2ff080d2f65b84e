"""Deployment profiles beyond one machine (Kubernetes)."""
