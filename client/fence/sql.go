package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Dialect is the SQL of one database: its placeholders and its DDL.
type Dialect struct {
	name   string
	create string // the fences table
	raise  string // raise the mark to the token unless it is above it
	mark   string // read the mark
}

// The statement that decides is one INSERT … ON CONFLICT … DO UPDATE …
// WHERE … RETURNING: it inserts the key's first mark, or raises the mark
// to a token at or above it, returning the row; a token below the mark
// updates nothing and returns no row. The row it writes stays locked
// until the caller's transaction ends, so a newer holder's check waits
// for an older holder's commit and never interleaves with it.
const (
	createTable = `CREATE TABLE IF NOT EXISTS lockd_fences (key text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0))`
	raiseSQL    = `INSERT INTO lockd_fences (key, token) VALUES (%[1]s, %[2]s) ON CONFLICT (key) DO UPDATE SET token = excluded.token WHERE lockd_fences.token <= excluded.token RETURNING token`
	markSQL     = `SELECT token FROM lockd_fences WHERE key = %[1]s`
)

// Postgres is PostgreSQL (9.5 and later), through any database/sql
// driver that takes $1 placeholders (pgx's stdlib, lib/pq).
var Postgres = Dialect{
	name:   "postgres",
	create: createTable,
	raise:  fmt.Sprintf(raiseSQL, "$1", "$2"),
	mark:   fmt.Sprintf(markSQL, "$1"),
}

// SQLite is SQLite (3.35 and later, for RETURNING), through any
// database/sql driver that takes ? placeholders.
var SQLite = Dialect{
	name:   "sqlite",
	create: createTable,
	raise:  fmt.Sprintf(raiseSQL, "?", "?"),
	mark:   fmt.Sprintf(markSQL, "?"),
}

// String is the dialect's name.
func (d Dialect) String() string { return d.name }

// SQL keeps the marks in a table of the guarded database:
//
//	CREATE TABLE IF NOT EXISTS lockd_fences (
//		key   text PRIMARY KEY,
//		token bigint NOT NULL CHECK (token > 0)
//	)
//
// Init creates it; a schema migration may create it instead. One table
// serves one lockd tenant: keys of two tenants are different locks with
// their own tokens, so give each tenant its own table's database or its
// own key prefix.
type SQL struct {
	db      *sql.DB
	dialect Dialect
}

// NewSQL keeps the marks in db, spoken to in dialect.
func NewSQL(db *sql.DB, dialect Dialect) *SQL {
	return &SQL{db: db, dialect: dialect}
}

// Init creates the fences table if it does not exist.
func (s *SQL) Init(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.dialect.create); err != nil {
		return fmt.Errorf("fence: create lockd_fences (%s): %w", s.dialect, err)
	}
	return nil
}

// Check raises key's mark to token inside tx, the transaction that makes
// the guarded writes (call it before them), or returns a *StaleError
// (errors.Is(err, ErrStale)) when the mark is above token; then the
// caller must roll tx back. The mark moves only if tx commits. It costs
// one statement, one round trip. Under PostgreSQL's REPEATABLE READ or
// SERIALIZABLE, a newer holder's concurrent commit ends tx with a
// serialization failure instead, retried like any other.
func (s *SQL) Check(ctx context.Context, tx *sql.Tx, key string, token uint64) error {
	if err := validate(key, token); err != nil {
		return err
	}
	var raised int64
	err := tx.QueryRowContext(ctx, s.dialect.raise, key, int64(token)).Scan(&raised)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("fence: check key %q token %d: %w", key, token, err)
	}
	// Refused. The mark is read only to say what the token lost to: the
	// refusal above is the decision, and the mark can only have grown.
	stale := &StaleError{Key: key, Token: token}
	var mark int64
	if err := tx.QueryRowContext(ctx, s.dialect.mark, key).Scan(&mark); err != nil {
		return errors.Join(stale, fmt.Errorf("fence: read the mark of key %q: %w", key, err))
	}
	stale.Mark = uint64(mark)
	return stale
}

// Fence is Check in a transaction of its own, committed at once: the
// Store that Handler uses. The mark is raised before the request's own
// writes are made, so it orders requests as they arrive; a service whose
// writes can be delayed past a newer holder's should Check inside the
// transaction of those writes instead.
func (s *SQL) Fence(ctx context.Context, key string, token uint64) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("fence: begin: %w", err)
	}
	if err := s.Check(ctx, tx, key, token); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fence: commit key %q token %d: %w", key, token, err)
	}
	return nil
}
