package engine

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"testing"
)

// TestKeyTableMatchesAMap drives the table and a map with the same random
// inserts, removals, sweeps and shrinks, with a hash of a few bits only so
// that long collision runs and wrap-around are exercised.
func TestKeyTableMatchesAMap(t *testing.T) {
	for _, bits := range []uint{4, 64} {
		t.Run(fmt.Sprint(bits, " hash bits"), func(t *testing.T) {
			seed := maphash.MakeSeed()
			hash := func(key []byte) uint64 { return maphash.Bytes(seed, key) >> (64 - bits) }
			rng := rand.New(rand.NewPCG(5, uint64(bits)))
			var table keyTable
			model := map[string]*entry{}
			for step := range 100000 {
				key := []byte(fmt.Sprint("k", rng.IntN(300)))
				switch op := rng.IntN(100); {
				case op < 45:
					if model[string(key)] == nil {
						ent := keyedEntry(1, key)
						table.insert(hash(key), ent)
						model[string(key)] = ent
					}
				case op < 90:
					if ent := model[string(key)]; ent != nil {
						table.remove(hash(key), ent)
						delete(model, string(key))
					}
				case op < 95:
					drop := rng.IntN(3)
					table.sweep(func(ent *entry) bool { return len(ent.key())%3 == drop })
					for k := range model {
						if len(k)%3 == drop {
							delete(model, k)
						}
					}
				default:
					table.shrink()
				}
				if table.count != len(model) {
					t.Fatalf("step %d: count %d, want %d", step, table.count, len(model))
				}
				probe := []byte(fmt.Sprint("k", rng.IntN(300)))
				if got := table.get(hash(probe), 1, probe); got != model[string(probe)] {
					t.Fatalf("step %d: get(%s) = %v, want %v", step, probe, got, model[string(probe)])
				}
				if got := table.get(hash(probe), 2, probe); got != nil {
					t.Fatalf("step %d: a key of another namespace matched", step)
				}
			}
			for k, ent := range model {
				if table.get(hash([]byte(k)), 1, []byte(k)) != ent {
					t.Fatalf("%s lost", k)
				}
			}
		})
	}
}

// After a flood the table gives its memory back.
func TestKeyTableShrinksAfterAFlood(t *testing.T) {
	seed := maphash.MakeSeed()
	var table keyTable
	var ents []*entry
	for i := range 100000 {
		ent := keyedEntry(0, fmt.Append(nil, i))
		table.insert(maphash.Bytes(seed, ent.key()), ent)
		ents = append(ents, ent)
	}
	flooded := len(table.slots)
	for _, ent := range ents[10:] {
		table.remove(maphash.Bytes(seed, ent.key()), ent)
	}
	table.shrink()
	if len(table.slots) > 64 || len(table.slots) >= flooded {
		t.Fatalf("%d slots for %d keys after a flood of %d slots", len(table.slots), table.count, flooded)
	}
	for _, ent := range ents[:10] {
		if table.get(maphash.Bytes(seed, ent.key()), 0, ent.key()) != ent {
			t.Fatalf("%s lost in the shrink", ent.key())
		}
	}
}

// keyedEntry is a table entry of key in ns, as newEntry makes one.
func keyedEntry(ns Namespace, key []byte) *entry {
	ent := &entry{ns: ns}
	ent.setKey(key)
	return ent
}
