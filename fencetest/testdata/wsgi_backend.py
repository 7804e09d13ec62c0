"""A service fenced by lockd.fence's WSGI middleware over its SQL store on
psycopg: a PUT sets guarded row 1's writer to the request's token. It
prints its port once listening. Usage: wsgi_backend.py PYTHON_DIR DSN"""

import sys

sys.path.insert(0, sys.argv[1])

import psycopg  # noqa: E402
from wsgiref.simple_server import WSGIRequestHandler, make_server  # noqa: E402

from lockd.fence import SQL, WSGIMiddleware  # noqa: E402

DSN = sys.argv[2]


def app(environ, start_response):
    token = int(environ["HTTP_LOCKD_TOKEN"])  # validated by the middleware
    with psycopg.connect(DSN) as conn:
        conn.execute("UPDATE guarded SET writer = %s WHERE id = 1", (token,))
    start_response("204 No Content", [])
    return [b""]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


server = make_server("127.0.0.1", 0, WSGIMiddleware(app, SQL("postgres", lambda: psycopg.connect(DSN))),
                     handler_class=Quiet)
print(server.server_port, flush=True)
server.serve_forever()
