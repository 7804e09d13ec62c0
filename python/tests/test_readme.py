"""The README's Python example is python/examples/pay_invoice.py, and it
runs against a server."""

import os
import subprocess
import sys

from conftest import ROOT


def test_readme_block_is_the_example_and_it_runs(server, tmp_path):
    path = os.path.join(ROOT, "python", "examples", "pay_invoice.py")
    example = open(path).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "```python\n" + example + "```\n" in readme, "README's Python block differs from the example"
    env = dict(os.environ, LOCKD_ADDR=server.addr, INVOICES_DB=str(tmp_path / "invoices.db"),
               PYTHONPATH=os.path.join(ROOT, "python"))
    for _ in range(2):  # the second run takes a larger token, and the fence lets it write
        out = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("invoice 42 paid, fence ")
    import sqlite3
    paid, fence = sqlite3.connect(env["INVOICES_DB"]).execute(
        "SELECT paid, fence FROM invoices WHERE id = 42").fetchone()
    assert paid == 1 and fence == int(out.stdout.split()[-1])


def public_signature(f):
    """f's signature as the README writes it: no self, no private
    parameters, no annotations."""
    import inspect
    sig = inspect.signature(f)
    params = [p.replace(annotation=inspect.Parameter.empty) for name, p in sig.parameters.items()
              if name != "self" and not name.startswith("_")]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def test_python_readme_signatures_and_defaults_are_the_code():
    import re
    import lockd
    text = re.sub(r"\s+", " ", open(os.path.join(ROOT, "python", "README.md")).read())
    for shown, f in [
        ("lockd.Client", lockd.Client),
        ("lockd.AsyncClient", lockd.AsyncClient),
        ("client.acquire", lockd.Client.acquire),
        ("client.acquire", lockd.AsyncClient.acquire),
        ("client.lock", lockd.Client.lock),
        ("client.lock", lockd.AsyncClient.lock),
        ("ticket.renew", lockd.Ticket.renew),
        ("lockd.Lock", lockd.Lock),
        ("lockd.AsyncLock", lockd.AsyncLock),
        ("lock.acquire", lockd.Lock.acquire),
        ("lock.acquire", lockd.AsyncLock.acquire),
        ("lock.release", lockd.Lock.release),
        ("lock.extend", lockd.Lock.extend),
    ]:
        want = shown + public_signature(f)
        assert want in text, f"python/README.md does not show {want}"
