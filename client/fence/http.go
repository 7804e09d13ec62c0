package fence

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/lockd/lockd/client"
)

// The request headers that carry a lock holder's key and token (the
// token in decimal), exactly once each.
const (
	HeaderKey   = "Lockd-Key"
	HeaderToken = "Lockd-Token"
)

// SetTicket puts t's key and token on a request's headers.
func SetTicket(h http.Header, t client.Ticket) { SetHeaders(h, t.Key(), t.Token()) }

// SetHeaders puts a key and a token on a request's headers, for a holder
// that has them as values (lockctl exec's LOCKD_KEY and LOCKD_TOKEN).
func SetHeaders(h http.Header, key string, token uint64) {
	h.Set(HeaderKey, key)
	h.Set(HeaderToken, strconv.FormatUint(token, 10))
}

// Handler fences every request before next sees it: it reads the
// Lockd-Key and Lockd-Token headers and passes the request on only if
// store accepts the token for the key. It answers, with a one-line plain
// text body and without calling next:
//
//	400 Bad Request           a header missing, repeated or malformed
//	409 Conflict              a stale token: a newer holder came first
//	503 Service Unavailable   the store failed (the request is not fenced)
func Handler(store Store, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys, tokens := r.Header[HeaderKey], r.Header[HeaderToken]
		if len(keys) != 1 || len(tokens) != 1 {
			http.Error(w, "lockd fence: want one Lockd-Key and one Lockd-Token header", http.StatusBadRequest)
			return
		}
		token, err := strconv.ParseUint(tokens[0], 10, 64)
		if err != nil {
			http.Error(w, "lockd fence: Lockd-Token is not a decimal token", http.StatusBadRequest)
			return
		}
		switch err := store.Fence(r.Context(), keys[0], token); {
		case err == nil:
			next.ServeHTTP(w, r)
		case errors.Is(err, ErrStale):
			http.Error(w, "lockd fence: stale token: a newer lock holder came first", http.StatusConflict)
		case errors.Is(err, ErrBadKey), errors.Is(err, ErrBadToken):
			http.Error(w, "lockd "+err.Error(), http.StatusBadRequest)
		default:
			http.Error(w, "lockd fence: the fence store failed", http.StatusServiceUnavailable)
		}
	})
}
