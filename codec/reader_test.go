package codec

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func TestResponseReaderOneByteAtATime(t *testing.T) {
	var stream []byte
	stream = AppendGreeting(stream, 0, [NonceLen]byte{0x0A}, "node")
	for i := range 100 {
		stream = AppendAcquired(stream, uint64(i+1), 0x0A, 0)
	}
	rr := NewResponseReader(iotest.OneByteReader(bytes.NewReader(stream)), 0)
	var r Response
	if err := rr.Next(&r); err != nil || r.Op != OpGreeting || string(r.NodeName) != "node" {
		t.Fatalf("greeting: %v %+v", err, r)
	}
	for i := range 100 {
		if err := rr.Next(&r); err != nil || r.Owner != uint64(i+1) || r.Token != 0x0A {
			t.Fatalf("frame %d: %v %+v", i, err, r)
		}
	}
	if err := rr.Next(&r); err != io.EOF {
		t.Fatalf("end of stream: %v", err)
	}
}

func TestResponseReaderErrors(t *testing.T) {
	var r Response
	cut := AppendAcquired(nil, 1, 2, 3)
	rr := NewResponseReader(bytes.NewReader(cut[:7]), 0)
	if err := rr.Next(&r); err != io.ErrUnexpectedEOF {
		t.Fatalf("a stream cut inside a frame: %v", err)
	}
	rr = NewResponseReader(bytes.NewReader([]byte("Z\n")), 0)
	if err := rr.Next(&r); err != BadRequest {
		t.Fatalf("an unknown op: %v", err)
	}
	boom := errors.New("boom")
	rr = NewResponseReader(iotest.ErrReader(boom), 0)
	if err := rr.Next(&r); err != boom {
		t.Fatalf("a read error: %v", err)
	}
	frames := append(AppendOwnerOnly(nil, OpPong, 1), AppendOwnerOnly(nil, OpPong, 2)...)
	rr = NewResponseReader(bytes.NewReader(frames), 0)
	if err := rr.Next(&r); err != nil || rr.Buffered() != len(frames)/2 {
		t.Fatalf("buffered after one of two frames: %d, %v", rr.Buffered(), err)
	}
}

func TestNextBufferedNeverReads(t *testing.T) {
	frames := append(AppendOwnerOnly(nil, OpPong, 1), AppendAcquired(nil, 2, 9, 0)...)
	// The second frame's last bytes arrive in a later read.
	stream := io.MultiReader(bytes.NewReader(frames[:len(frames)-3]), bytes.NewReader(frames[len(frames)-3:]))
	rr := NewResponseReader(stream, 0)
	var r Response
	if err := rr.Next(&r); err != nil || r.Owner != 1 {
		t.Fatalf("first frame: %v %+v", err, r)
	}
	if ok, err := rr.NextBuffered(&r); ok || err != nil {
		t.Fatalf("an incomplete buffered frame was decoded: %v %v", ok, err)
	}
	if err := rr.Next(&r); err != nil || r.Owner != 2 || r.Token != 9 {
		t.Fatalf("second frame after the next read: %v %+v", err, r)
	}
	rr = NewResponseReader(bytes.NewReader(append(AppendOwnerOnly(nil, OpPong, 1), "Z\n"...)), 0)
	if err := rr.Next(&r); err != nil {
		t.Fatal(err)
	}
	if ok, err := rr.NextBuffered(&r); ok || err != BadRequest {
		t.Fatalf("a buffered frame no server sends: %v %v", ok, err)
	}
}

func TestResponseReaderAllocatesNothing(t *testing.T) {
	frame := AppendAcquired(nil, 1, 2, 3)
	src := bytes.NewReader(nil)
	rr := NewResponseReader(src, 4096)
	var r Response
	allocs := testing.AllocsPerRun(100, func() {
		src.Reset(frame)
		if err := rr.Next(&r); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per frame", allocs)
	}
}
