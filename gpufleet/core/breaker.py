"""The remediation circuit breaker's threshold, one formula for every consumer: the Pulumi program
gives NVSentinel the stack's share as a whole percent (infra.self_healing), NVSentinel's
fault-quarantine trips when the nodes cordoned within the window reach ceil(nodes x percent / 100)
(breaker/slidingWindowBreaker), the Kubernetes sandbox's stand-in and the simulator do the same.
"""

from __future__ import annotations

import math


def breaker_percentage(max_quarantined_share: float) -> int:
    """The stack's share as NVSentinel's whole percent, rounded up so a small share never becomes 0
    (which would block every quarantine)."""
    return max(1, math.ceil(max_quarantined_share * 100))


def breaker_threshold(max_quarantined_share: float, total_nodes: int) -> int:
    """Quarantines within the window at which the breaker trips (no new one at or above it)."""
    return math.ceil(total_nodes * breaker_percentage(max_quarantined_share) / 100)
