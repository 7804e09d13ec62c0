package fencetest

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/fence"
)

// The test binary runs as a lock holder when FENCETEST_ROLE=holder; the
// rest of its environment says what to do:
//
//	FENCETEST_ADDRS  lockd addresses, comma-separated
//	FENCETEST_KEY    the key to lock and fence
//	FENCETEST_LEASE  the lease (a duration)
//	FENCETEST_GATE   "1": after the grant, wait for a line on stdin before
//	                 writing (the test pauses the holder there)
//	FENCETEST_WRITE  sql:DSN (fence.SQL.Check and an UPDATE of
//	                 guarded row 1 in one transaction) or http:URL (a PUT
//	                 with the ticket's headers)
//
// It prints "token N" once granted and sure of its lease, then one line with the write's
// outcome: "wrote", "stale MARK" (fence.ErrStale from the SQL check),
// "refused STATUS" (an HTTP answer other than 2xx) or "error ...".
const roleEnv = "FENCETEST_ROLE"

func runHolder() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := time.ParseDuration(os.Getenv("FENCETEST_LEASE"))
	if err != nil {
		fmt.Println("error FENCETEST_LEASE:", err)
		return 1
	}
	c, err := client.Dial(ctx, client.Config{Addrs: strings.Split(os.Getenv("FENCETEST_ADDRS"), ",")})
	if err != nil {
		fmt.Println("error dial:", err)
		return 1
	}
	defer c.Close()
	ticket, err := c.Acquire(ctx, os.Getenv("FENCETEST_KEY"), client.AcquireOptions{
		Lease: lease, Wait: 30 * time.Second, MinWorkBudget: client.Budget(time.Second)})
	if err != nil {
		fmt.Println("error acquire:", err)
		return 1
	}
	if ticket.Remaining() <= 0 {
		fmt.Println("error the lease ran out before the write")
		return 1
	}
	fmt.Println("token", ticket.Token())
	// The pause lands here: after the holder made sure of its lease,
	// before its write — the window no lease check can close.
	if os.Getenv("FENCETEST_GATE") == "1" {
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			fmt.Println("error gate:", err)
			return 1
		}
	}
	target := os.Getenv("FENCETEST_WRITE")
	switch {
	case strings.HasPrefix(target, "sql:"):
		fmt.Println(writeSQL(ctx, strings.TrimPrefix(target, "sql:"), ticket))
	case strings.HasPrefix(target, "http:"):
		fmt.Println(writeHTTP(ctx, strings.TrimPrefix(target, "http:"), ticket))
	default:
		fmt.Printf("error FENCETEST_WRITE %q\n", target)
		return 1
	}
	return 0
}

// writeSQL sets guarded row 1's writer to the ticket's token in a
// transaction fenced by fence.SQL.
func writeSQL(ctx context.Context, dsn string, ticket client.Ticket) string {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "error " + err.Error()
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "error " + err.Error()
	}
	defer tx.Rollback()
	var stale *fence.StaleError
	switch err := fence.NewSQL(db, fence.Postgres).Check(ctx, tx, ticket.Key(), ticket.Token()); {
	case errors.As(err, &stale):
		return fmt.Sprint("stale ", stale.Mark)
	case err != nil:
		return "error " + err.Error()
	}
	if _, err := tx.ExecContext(ctx, `UPDATE guarded SET writer = $1 WHERE id = 1`, int64(ticket.Token())); err != nil {
		return "error " + err.Error()
	}
	if err := tx.Commit(); err != nil {
		return "error " + err.Error()
	}
	return "wrote"
}

// writeHTTP PUTs to url with the ticket's key and token.
func writeHTTP(ctx context.Context, url string, ticket client.Ticket) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, nil)
	if err != nil {
		return "error " + err.Error()
	}
	fence.SetTicket(req.Header, ticket)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "error " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Sprintf("refused %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return "wrote"
}
