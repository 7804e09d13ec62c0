package codec

import "testing"

func BenchmarkDecodeAcquire(b *testing.B) {
	frame := AppendAcquire(nil, 42, 30, 5, "orders/0000001234")
	var req Request
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := DecodeRequest(frame, &req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeResponse(b *testing.B) {
	frame := AppendAcquired(nil, 42, 7, 0)
	var resp Response
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeResponse(frame, &resp); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeAcquireRelease(b *testing.B) {
	buf := make([]byte, 0, 2*MaxRequestFrame)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendAcquire(buf[:0], 42, 30, 5, "orders/0000001234")
		buf = AppendRelease(buf, 42, 7, "orders/0000001234")
	}
}

func BenchmarkDecodeFieldError(b *testing.B) {
	frame := AppendAcquire(nil, 42, 0, 5, "k")
	var req Request
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRequest(frame, &req); err != BadLease {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeKeep(b *testing.B) {
	frame := AppendKeep(nil, 42, 7, 30, "orders/0000001234")
	var req Request
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := DecodeRequest(frame, &req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeKeep(b *testing.B) {
	buf := make([]byte, 0, MaxRequestFrame)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendKeep(buf[:0], 42, 7, 30, "orders/0000001234")
	}
}
