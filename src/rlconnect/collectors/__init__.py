"""Collectors: per-agent trajectory handles, per-policy row stores, and the batch builder."""

from rlconnect.collectors.agent_collector import AgentCollector
from rlconnect.collectors.group import PolicyCollectorGroup
from rlconnect.collectors.modes import BatchMode, CountStepsBy
from rlconnect.collectors.policy_collector import PolicyCollector
from rlconnect.collectors.store import ColumnStore

__all__ = [
    "AgentCollector",
    "BatchMode",
    "ColumnStore",
    "CountStepsBy",
    "PolicyCollector",
    "PolicyCollectorGroup",
]
