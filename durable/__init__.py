"""durable: journaled workflows for operations that cannot be undone.

A workflow is an ``async def`` of journaled activities. A worker claims runs with a
compare-and-set, holds them under a lease renewed by heartbeats, and carries a fencing token
into every journal write, state change and HTTP request, so an attempt that lost its lease
can do nothing more. See README.md for the guarantees and their limits.
"""

from ._approval import Approval as Approval
from ._approval import ApprovalRejected as ApprovalRejected
from ._approval import approval_gate as approval_gate
from ._client import Client as Client
from ._clock import Clock as Clock
from ._clock import FakeClock as FakeClock
from ._clock import WallClock as WallClock
from ._context import FENCING_HEADER as FENCING_HEADER
from ._context import FENCING_SCOPE_HEADER as FENCING_SCOPE_HEADER
from ._context import IDEMPOTENCY_HEADER as IDEMPOTENCY_HEADER
from ._context import ActivityContext as ActivityContext
from ._context import WorkflowContext as WorkflowContext
from ._errors import ActivityError as ActivityError
from ._errors import AttemptCancelled as AttemptCancelled
from ._errors import ConfigError as ConfigError
from ._errors import DurableError as DurableError
from ._errors import InvalidStateError as InvalidStateError
from ._errors import LeaseLostError as LeaseLostError
from ._errors import NonDeterminismError as NonDeterminismError
from ._errors import NonRetryableError as NonRetryableError
from ._errors import NotJsonError as NotJsonError
from ._errors import NotSentError as NotSentError
from ._errors import ResultUnknownError as ResultUnknownError
from ._errors import RunConflictError as RunConflictError
from ._errors import RunNotFoundError as RunNotFoundError
from ._errors import RunPrunedError as RunPrunedError
from ._errors import SchemaVersionError as SchemaVersionError
from ._errors import SignalTimeout as SignalTimeout
from ._errors import StaleRecordError as StaleRecordError
from ._errors import StepInDoubtError as StepInDoubtError
from ._errors import StoreError as StoreError
from ._errors import StoreUnavailableError as StoreUnavailableError
from ._errors import UnknownWorkflowError as UnknownWorkflowError
from ._interceptors import Counters as Counters
from ._interceptors import Interceptor as Interceptor
from ._logging import RedactingFilter as RedactingFilter
from ._logging import configure_logging as configure_logging
from ._processes import abort_process_group as abort_process_group
from ._processes import process_group as process_group
from ._registry import NOT_DONE as NOT_DONE
from ._registry import Activity as Activity
from ._registry import Registry as Registry
from ._registry import RetryPolicy as RetryPolicy
from ._registry import Workflow as Workflow
from ._registry import activity as activity
from ._registry import default_registry as default_registry
from ._registry import workflow as workflow
from ._report import RecoveryReport as RecoveryReport
from ._retention import PrunedRun as PrunedRun
from ._schedules import Schedule as Schedule
from ._schedules import ScheduleSpec as ScheduleSpec
from ._schedules import schedule as schedule
from ._types import EntryKind as EntryKind
from ._types import JournalEntry as JournalEntry
from ._types import PausedWorkflow as PausedWorkflow
from ._types import Run as Run
from ._types import RunState as RunState
from ._types import StartedRun as StartedRun
from ._types import StepState as StepState
from ._version import __version__ as __version__
from ._worker import Worker as Worker
from .store import Store as Store
from .store import store_from_url as store_from_url

__all__ = [
    "FENCING_HEADER",
    "FENCING_SCOPE_HEADER",
    "IDEMPOTENCY_HEADER",
    "NOT_DONE",
    "Activity",
    "ActivityContext",
    "ActivityError",
    "Approval",
    "ApprovalRejected",
    "AttemptCancelled",
    "Client",
    "Clock",
    "ConfigError",
    "Counters",
    "DurableError",
    "EntryKind",
    "FakeClock",
    "Interceptor",
    "InvalidStateError",
    "JournalEntry",
    "LeaseLostError",
    "NonDeterminismError",
    "NonRetryableError",
    "NotJsonError",
    "NotSentError",
    "PausedWorkflow",
    "PrunedRun",
    "RecoveryReport",
    "RedactingFilter",
    "Registry",
    "ResultUnknownError",
    "RetryPolicy",
    "Run",
    "RunConflictError",
    "RunNotFoundError",
    "RunPrunedError",
    "RunState",
    "Schedule",
    "ScheduleSpec",
    "SchemaVersionError",
    "SignalTimeout",
    "StaleRecordError",
    "StartedRun",
    "StepInDoubtError",
    "StepState",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "UnknownWorkflowError",
    "WallClock",
    "Worker",
    "Workflow",
    "WorkflowContext",
    "abort_process_group",
    "activity",
    "approval_gate",
    "configure_logging",
    "default_registry",
    "process_group",
    "schedule",
    "store_from_url",
    "workflow",
]
