"""lockd: the Python client of the lockd lock tier.

`lockd.Client` is the blocking client, `lockd.AsyncClient` the asyncio one;
both keep the rules of the Go client (docs/protocol.md §6, §6a) over one
protocol core. `lockd.Lock` and `lockd.AsyncLock` are reusable lock objects
over them, in the style of threading.Lock. Exceptions are in lockd.errors
and re-exported here.
"""

__version__ = "0.1.0"

from .aio import AsyncClient, AsyncTicket
from .errors import (Auth, BadKey, Busy, Closed, Config, Indeterminate, InsufficientLease,
                     LockdError, NotConnected, NotHeld, OwnerExhausted, Protocol, ShuttingDown,
                     Timeout, TLS, TokenExhausted, Unavailable, UnsupportedDuration, WaitElapsed)
from ._core import Stats
from .lock import AsyncLock, Lock
from .sync import Client, Ticket

__all__ = [
    "AsyncClient", "AsyncLock", "AsyncTicket", "Client", "Lock", "Stats", "Ticket", "__version__",
    "Auth", "BadKey", "Busy", "Closed", "Config", "Indeterminate", "InsufficientLease",
    "LockdError", "NotConnected", "NotHeld", "OwnerExhausted", "Protocol", "ShuttingDown",
    "Timeout", "TLS", "TokenExhausted", "Unavailable", "UnsupportedDuration", "WaitElapsed",
]
