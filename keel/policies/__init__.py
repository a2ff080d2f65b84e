"""Policies: the types and their schemas (``types``), the versioned hash-chained store (``store``), and the
gateway's policy with the store's commits laid over it (``gateway``). One error family (``errors``)."""

from keel.policies.errors import PolicyError, PolicyValidationError
from keel.policies.store import Commit, Policy, PolicyReader, PolicyStore, VerifyResult, commit_hash, load_policy_file
from keel.policies.types import POLICY_TYPES, validate_policy

__all__ = [
    "POLICY_TYPES",
    "Commit",
    "Policy",
    "PolicyError",
    "PolicyReader",
    "PolicyStore",
    "PolicyValidationError",
    "VerifyResult",
    "commit_hash",
    "load_policy_file",
    "validate_policy",
]
