"""Plain async clients for the external services the workflows act on.

They know nothing of the engine: each takes an ``httpx.AsyncClient`` (the engine passes
its fenced per-attempt client), a base URL and a token. The ``git`` module runs the real
git program. See :mod:`activities.errors` for the error tree.

:mod:`activities.steps` runs them as durable activities (journaled steps over the attempt's
fenced ``ctx.http``), configured from the environment by :mod:`activities.config`; this
package does not import them, so the plain clients stay free of the engine.
"""

from .errors import NotFoundError as NotFoundError
from .errors import RetryLaterError as RetryLaterError
from .errors import ServiceError as ServiceError
from .errors import ServiceUnreachableError as ServiceUnreachableError
from .errors import StaleFencingTokenError as StaleFencingTokenError
from .githost import CreateOutcome as CreateOutcome
from .githost import CreateResult as CreateResult
from .githost import GitHostClient as GitHostClient
from .githost import Lookup as Lookup
from .githost import LookupResult as LookupResult
from .githost import Repository as Repository
from .notify import Notifier as Notifier
from .outcomes import DeleteOutcome as DeleteOutcome
from .paas import Application as Application
from .paas import Database as Database
from .paas import EnvVar as EnvVar
from .paas import PaasClient as PaasClient
from .paas import Storage as Storage
from .tts import Speech as Speech
from .tts import TtsClient as TtsClient

__all__ = [
    "Application",
    "CreateOutcome",
    "CreateResult",
    "Database",
    "DeleteOutcome",
    "EnvVar",
    "GitHostClient",
    "Lookup",
    "LookupResult",
    "NotFoundError",
    "Notifier",
    "PaasClient",
    "Repository",
    "RetryLaterError",
    "ServiceError",
    "ServiceUnreachableError",
    "Speech",
    "StaleFencingTokenError",
    "TtsClient",
]
