"""Slow-node blocklist with expiry (FLIP-224 MARK_BLOCKED: running attempts continue, new ones avoid it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Blocklist:
    """Nodes blocked for new attempts until a deadline on the controller clock."""

    until: dict[str, float] = field(default_factory=dict)

    def block(self, node: str, until: float) -> bool:
        """Block ``node`` until ``until``; extend an existing block. Return True if it was not blocked."""
        was_blocked = node in self.until
        self.until[node] = max(until, self.until.get(node, until))
        return not was_blocked

    def is_blocked(self, node: str, now: float) -> bool:
        """True while ``node`` is blocked at ``now``."""
        return self.until.get(node, float("-inf")) > now

    def expire(self, now: float) -> list[str]:
        """Forget blocks that have ended; return the nodes released."""
        released = [node for node, deadline in self.until.items() if deadline <= now]
        for node in released:
            del self.until[node]
        return released

    def active(self, now: float) -> dict[str, float]:
        """Return node -> deadline for blocks still in force."""
        return {node: deadline for node, deadline in self.until.items() if deadline > now}
