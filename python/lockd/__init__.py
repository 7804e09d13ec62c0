"""lockd: the Python client of the lockd lock tier.

`lockd.Client` is the blocking client, `lockd.AsyncClient` the asyncio one;
both keep the rules of the Go client (docs/protocol.md §6) over one protocol
core. Exceptions are in lockd.errors and re-exported here.
"""

from .aio import AsyncClient, AsyncTicket
from .errors import (Auth, BadKey, Busy, Closed, Config, Indeterminate, InsufficientLease,
                     LockdError, NotConnected, NotHeld, OwnerExhausted, Protocol, ShuttingDown,
                     Timeout, TLS, TokenExhausted, Unavailable, UnsupportedDuration, WaitElapsed)
from ._core import Stats
from .sync import Client, Ticket

__all__ = [
    "AsyncClient", "AsyncTicket", "Client", "Stats", "Ticket",
    "Auth", "BadKey", "Busy", "Closed", "Config", "Indeterminate", "InsufficientLease",
    "LockdError", "NotConnected", "NotHeld", "OwnerExhausted", "Protocol", "ShuttingDown",
    "Timeout", "TLS", "TokenExhausted", "Unavailable", "UnsupportedDuration", "WaitElapsed",
]
