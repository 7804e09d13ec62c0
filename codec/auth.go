package codec

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Domain separators of the handshake MACs (SPEC §7): a client MAC can
// never be replayed as a server MAC.
const (
	clientMACLabel = "lockd-v1-client"
	serverMACLabel = "lockd-v1-server"
)

// ClientMAC is HMAC-SHA256(secret, "lockd-v1-client" | server_nonce |
// client_nonce | tenant), sent in HELLO.
func ClientMAC(secret []byte, serverNonce, clientNonce [NonceLen]byte, tenant []byte) [MACLen]byte {
	return handshakeMAC(secret, clientMACLabel, serverNonce, clientNonce, tenant)
}

// ServerMAC is HMAC-SHA256(secret, "lockd-v1-server" | client_nonce |
// server_nonce | tenant), sent in WELCOME so the client authenticates the
// server too.
func ServerMAC(secret []byte, clientNonce, serverNonce [NonceLen]byte, tenant []byte) [MACLen]byte {
	return handshakeMAC(secret, serverMACLabel, clientNonce, serverNonce, tenant)
}

func handshakeMAC(secret []byte, label string, first, second [NonceLen]byte, tenant []byte) [MACLen]byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(first[:])
	m.Write(second[:])
	m.Write(tenant)
	var out [MACLen]byte
	m.Sum(out[:0])
	return out
}

// EqualMAC compares two MACs in constant time.
func EqualMAC(a, b [MACLen]byte) bool {
	return hmac.Equal(a[:], b[:])
}
