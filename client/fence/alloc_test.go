//go:build !race

package fence_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/lockd/lockd/client/fence"
)

// The in-memory check of a key it has seen, alone and through Handler,
// allocates nothing. The race detector allocates on its own, so this
// check runs without it.
func TestMemoryFenceDoesNotAllocate(t *testing.T) {
	var marks fence.Memory
	ctx := context.Background()
	token := uint64(1)
	if allocs := testing.AllocsPerRun(200, func() {
		token++
		if err := marks.Fence(ctx, "invoice/42", token); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("%v allocations per Memory.Fence, want 0", allocs)
	}

	h := fence.Handler(&marks, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodPost, "/invoice/42", nil)
	fence.SetHeaders(r.Header, "invoice/42", token)
	w := discard{h: http.Header{}}
	if allocs := testing.AllocsPerRun(200, func() { h.ServeHTTP(w, r) }); allocs != 0 {
		t.Errorf("%v allocations per accepted request through Handler over Memory, want 0", allocs)
	}
}
