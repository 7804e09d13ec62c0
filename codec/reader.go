package codec

import (
	"errors"
	"io"
)

// ResponseReader decodes server frames from a byte stream, in the manner
// of net/textproto.Reader. It owns one buffer, reads from the stream only
// when the buffered bytes hold no complete frame, and allocates nothing
// after NewResponseReader. Handshake and steady-state reading share it, so
// no byte read past the GREETING or WELCOME is lost.
type ResponseReader struct {
	r          io.Reader
	buf        []byte
	start, end int
}

// NewResponseReader reads from r through a buffer of size bytes (at least
// MaxFrame, so that any well-formed frame fits).
func NewResponseReader(r io.Reader, size int) *ResponseReader {
	return &ResponseReader{r: r, buf: make([]byte, max(size, MaxFrame))}
}

// Next decodes the next frame into resp; resp.NodeName aliases the
// reader's buffer until the following call. It returns a decode error
// (BadRequest, Oversized) for a frame a conforming server never sends, and
// the stream's error once no complete frame is buffered; a stream that
// ends inside a frame gives io.ErrUnexpectedEOF.
func (rr *ResponseReader) Next(resp *Response) error {
	for {
		ok, err := rr.NextBuffered(resp)
		if ok || err != nil {
			return err
		}
		if rr.start > 0 {
			rr.end = copy(rr.buf, rr.buf[rr.start:rr.end])
			rr.start = 0
		}
		m, rerr := rr.r.Read(rr.buf[rr.end:])
		rr.end += m
		if rerr != nil && m == 0 {
			if errors.Is(rerr, io.EOF) && rr.end > 0 {
				return io.ErrUnexpectedEOF
			}
			return rerr
		}
	}
}

// NextBuffered decodes the next frame into resp only if the bytes already
// read hold all of it; it never reads from the stream. It reports whether
// it decoded one, so that a reader can hand out every answer of one read
// before it blocks again.
func (rr *ResponseReader) NextBuffered(resp *Response) (bool, error) {
	n, err := DecodeResponse(rr.buf[rr.start:rr.end], resp)
	switch err {
	case nil:
		rr.start += n
		return true, nil
	case ErrIncomplete:
		return false, nil
	}
	return false, err
}

// Buffered reports how many bytes have been read but not yet decoded.
func (rr *ResponseReader) Buffered() int { return rr.end - rr.start }
