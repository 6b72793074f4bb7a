"""The engine's storage boundary and its implementations.

:class:`Store` is the whole boundary (the engine reaches a database only through it), and
these are the types that cross it: what a client asks to create (:class:`NewRun`), the
identity every write of an attempt is conditioned on (:class:`Fence`), the journal entries
an attempt appends (:class:`JournalWrite`; read back as :class:`durable.JournalEntry`), the
answer to a lease renewal (:class:`Renewal`), and the fenced application records
(:class:`Record`), a signal sent to a run and what the store did with it (:class:`Signal`,
:class:`SignalSent`). A list page's cursor is a :data:`Cursor`. The optional capabilities
(change signals: ``pushes_changes``, ``change_watcher``, ``wait_for_work``, ...) are methods
of :class:`Store` with a default, so a store implements only what it can do better.
"""

from .._types import Fence as Fence
from .._types import JournalWrite as JournalWrite
from .._types import NewRun as NewRun
from .._types import Record as Record
from .._types import Renewal as Renewal
from .._types import Signal as Signal
from .._types import SignalSent as SignalSent
from ._base import SCHEMA_VERSION as SCHEMA_VERSION
from ._base import Cursor as Cursor
from ._base import Store as Store
from ._url import store_from_url as store_from_url

__all__ = [
    "SCHEMA_VERSION",
    "Cursor",
    "Fence",
    "JournalWrite",
    "NewRun",
    "Record",
    "Renewal",
    "Signal",
    "SignalSent",
    "Store",
    "store_from_url",
]
