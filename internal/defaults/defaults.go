// Package defaults is the one way lockd's configurations (engine, server,
// cluster, client, bench) fill their unset numbers: a field left at zero
// takes its default. It knows nothing of what the numbers mean; the
// configurations check their own ranges.
package defaults

// Number is what a configuration's counts, sizes and durations are.
type Number interface {
	~int | ~int64 | ~uint64 | ~uint32 | ~float64
}

// Or returns v when it is set (above zero), def otherwise. A negative v
// counts as unset: the configurations that refuse negative values check
// that before.
func Or[T Number](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
