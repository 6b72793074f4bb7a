"""The interceptor protocol (docs/observability.md): subclass :class:`Interceptor`, override
the hooks you need, pass ``Worker(..., interceptors=[...])`` (and ``Client(...,
interceptors=[...])`` for ``on_start``)."""

from ._interceptors import ATTEMPT_OUTCOMES as ATTEMPT_OUTCOMES
from ._interceptors import LOOPS as LOOPS
from ._interceptors import AttemptInfo as AttemptInfo
from ._interceptors import ClaimInfo as ClaimInfo
from ._interceptors import Counters as Counters
from ._interceptors import Interceptor as Interceptor
from ._interceptors import RenewInfo as RenewInfo
from ._interceptors import RequestInfo as RequestInfo
from ._interceptors import StartInfo as StartInfo
from ._interceptors import StepInfo as StepInfo
from ._interceptors import WriteInfo as WriteInfo

__all__ = [
    "ATTEMPT_OUTCOMES",
    "LOOPS",
    "AttemptInfo",
    "ClaimInfo",
    "Counters",
    "Interceptor",
    "RenewInfo",
    "RequestInfo",
    "StartInfo",
    "StepInfo",
    "WriteInfo",
]
