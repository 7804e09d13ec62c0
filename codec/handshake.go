package codec

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
)

// Classes of handshake failure that are not the stream's own error; the
// errors ClientHandshake returns match exactly one of them with errors.Is,
// or none when reading or writing the stream failed.
var (
	// ErrHandshakeProtocol: the server sent a frame SPEC §7 has no place
	// for — not a version 1 GREETING first, an undecodable frame, or
	// neither WELCOME nor E in answer to HELLO.
	ErrHandshakeProtocol = errors.New("codec: handshake protocol violation")
	// ErrHandshakeAuth: client and server disagree on whether
	// authentication is on, or the server's MAC does not verify.
	ErrHandshakeAuth = errors.New("codec: handshake authentication failed")
	// ErrHandshakeRefused: the server answered HELLO with E; the Reason
	// is in the chain (errors.As).
	ErrHandshakeRefused = errors.New("codec: the server refused the HELLO")
)

// Credentials are what a client authenticates with (SPEC §7). With a
// Secret the server must ask for authentication and prove it knows the
// secret too: a server that does not ask is refused rather than trusted.
// With neither, the connection is the tenant "default".
type Credentials struct {
	Tenant string
	Secret []byte
}

// ClientHandshake runs the client side of SPEC §7: it reads the GREETING
// from rr, sends HELLO to w when authentication is on or a tenant is
// named, and checks the WELCOME. It leaves in rr whatever the server sent
// after the handshake, and returns the GREETING's flags (a caller ignores
// bits it does not know, SPEC §3). It owns no socket: deadlines on the
// stream are the caller's.
func ClientHandshake(w io.Writer, rr *ResponseReader, creds Credentials) (flags uint8, err error) {
	var resp Response
	if err := handshakeFrame(rr, &resp, "greeting"); err != nil {
		return 0, err
	}
	if resp.Op != OpGreeting || resp.Version != Version {
		return 0, fmt.Errorf("%w: op %q version %d instead of a version %d GREETING", ErrHandshakeProtocol, resp.Op, resp.Version, Version)
	}
	authRequired := resp.Flags&GreetingAuthRequired != 0
	switch {
	case authRequired && len(creds.Secret) == 0:
		return 0, fmt.Errorf("%w: the server requires authentication and no secret is given", ErrHandshakeAuth)
	case !authRequired && len(creds.Secret) != 0:
		return 0, fmt.Errorf("%w: the server does not authenticate, so it cannot prove it knows the secret", ErrHandshakeAuth)
	case !authRequired && creds.Tenant == "":
		return resp.Flags, nil
	}
	flags = resp.Flags
	serverNonce := resp.ServerNonce
	var clientNonce [NonceLen]byte
	rand.Read(clientNonce[:])
	mac := ClientMAC(creds.Secret, serverNonce, clientNonce, []byte(creds.Tenant))
	if _, err := w.Write(AppendHello(nil, clientNonce, mac, creds.Tenant)); err != nil {
		return 0, fmt.Errorf("hello: %w", err)
	}
	if err := handshakeFrame(rr, &resp, "welcome"); err != nil {
		return 0, err
	}
	switch resp.Op {
	case OpWelcome:
	case OpError:
		return 0, fmt.Errorf("%w: %w", ErrHandshakeRefused, resp.Reason)
	default:
		return 0, fmt.Errorf("%w: HELLO answered with op %q", ErrHandshakeProtocol, resp.Op)
	}
	// With auth off the WELCOME carries zeros: there is nothing to verify.
	if authRequired && !EqualMAC(resp.ServerMAC, ServerMAC(creds.Secret, clientNonce, serverNonce, []byte(creds.Tenant))) {
		return 0, fmt.Errorf("%w: the server MAC does not verify", ErrHandshakeAuth)
	}
	return flags, nil
}

// handshakeFrame reads the next frame; a frame no conforming server sends
// is a protocol violation, any other failure the stream's own.
func handshakeFrame(rr *ResponseReader, resp *Response, what string) error {
	err := rr.Next(resp)
	if _, undecodable := err.(Reason); undecodable {
		return fmt.Errorf("%w: undecodable %s: %w", ErrHandshakeProtocol, what, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
