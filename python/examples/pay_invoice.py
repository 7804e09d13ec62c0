# Pay invoice 42 under a lockd lock. The fencing token goes into the
# UPDATE, so a holder whose lease ran out unnoticed (a long pause, a
# partition) cannot overwrite the work of the holder after it.
import os
import sqlite3

import lockd

db = sqlite3.connect(os.environ.get("INVOICES_DB", "invoices.db"))
db.execute("CREATE TABLE IF NOT EXISTS invoices (id INTEGER PRIMARY KEY, paid INT, fence INT)")
db.execute("INSERT OR IGNORE INTO invoices VALUES (42, 0, 0)")

with lockd.Client(os.environ.get("LOCKD_ADDR", "127.0.0.1:7420")) as client:
    try:
        # lease: the lock lapses by itself after it; wait: how long to queue
        # behind another holder; min_work_budget (required): the time you
        # need once you hold it. A grant with less validity left is handed
        # back and reported lockd.Indeterminate.
        with client.lock("invoice/42", lease=30, wait=5, min_work_budget=2) as ticket:
            with db:  # commits, or rolls back on an exception
                db.execute("UPDATE invoices SET paid = 1, fence = ? WHERE id = 42 AND fence < ?",
                           (ticket.token, ticket.token))
    except (lockd.Timeout, lockd.Busy, lockd.WaitElapsed) as e:
        raise SystemExit(f"invoice 42 is locked by someone else: {e}")
print("invoice 42 paid, fence", ticket.token)
