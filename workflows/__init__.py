"""The operations as durable workflows; importing this package registers them all.

``python -m durable.worker --import workflows`` runs ``slot.reset``, ``slot.teardown``,
``slot.promote`` and ``audio.batch`` (into :data:`durable.default_registry`). Their
activities (:mod:`activities.steps`) read the service configuration from the worker's
environment; see :mod:`activities.config`.
"""

from . import audio as audio
from . import records as records
from . import slots as slots
from . import status as status
from .records import Slot as Slot
from .status import reset_message as reset_message
from .status import reset_status as reset_status
from .status import run_status as run_status

__all__ = ["Slot", "audio", "records", "reset_message", "reset_status", "run_status", "slots",
           "status"]
