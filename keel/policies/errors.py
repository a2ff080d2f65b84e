"""The one error family of policies: a refused store operation, a policy that breaks its type's schema."""

from __future__ import annotations

from keel.errors import KeelError


class PolicyError(KeelError):
    """A policy was refused: a store operation (version conflict, unknown version or name), or a value that is
    missing, of the wrong type or out of range (a gateway policy file, a committed body)."""


class PolicyValidationError(PolicyError):
    """A policy breaks a rule of its type's schema; ``rule`` names which."""

    def __init__(self, name: str, rule: str, message: str):
        super().__init__(f"policy '{name}': rule {rule}: {message}")
        self.name, self.rule = name, rule
