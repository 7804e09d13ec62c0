// Package privatefile reads files that hold secrets (lockd's auth file, a
// client's secret file) and refuses them when their mode lets the group
// or others in, as ssh does with private keys: a secret anyone on the
// machine can read authenticates anyone on the machine.
package privatefile

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// ReadFile returns the contents of the file at path, or an error naming
// the file and the chmod that fixes it when its mode gives the group or
// others any access.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s holds secrets but its mode %04o lets the group or others in: run chmod 600 %s", path, perm, path)
	}
	return io.ReadAll(f)
}

// ReadToken reads a file of one token (a bearer token), refused as
// ReadFile refuses a file, or when the token is shorter than minLen or
// holds spaces.
func ReadToken(path string, minLen int) ([]byte, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	token := bytes.TrimSpace(data)
	if len(token) < minLen || bytes.ContainsAny(token, " \t\r\n") {
		return nil, fmt.Errorf("%s: want one token of at least %d characters without spaces; make one with `openssl rand -hex 32`", path, minLen)
	}
	return token, nil
}
