package bench

import (
	"math"
	"math/bits"
	"testing"
)

// Known values: exact ones counted by hand (the most extreme of the
// C(n+m, n) equally likely splits), and SciPy's documented example
// (scipy.stats.mannwhitneyu, males against females: U = 17, exact p =
// 1/9, asymptotic p = 0.11134688653314041).
func TestMannWhitneyKnownValues(t *testing.T) {
	males := []float64{19, 22, 16, 29, 24}
	females := []float64{20, 11, 17, 12}
	for _, tc := range []struct {
		name string
		x, y []float64
		u, p float64
	}{
		{"3 below 3", []float64{1, 2, 3}, []float64{4, 5, 6}, 0, 2.0 / 20},
		{"3 above 3", []float64{4, 5, 6}, []float64{1, 2, 3}, 9, 2.0 / 20},
		{"5 below 5", []float64{1, 2, 3, 4, 5}, []float64{6, 7, 8, 9, 10}, 0, 2.0 / 252},
		{"scipy example", males, females, 17, 1.0 / 9},
		{"scipy example swapped", females, males, 3, 1.0 / 9},
		{"all tied", []float64{7, 7, 7}, []float64{7, 7}, 3, 1},
		{"interleaved", []float64{1, 3, 5, 7}, []float64{2, 4, 6, 8}, 6, 0.6857142857142857}, // 48 of 70 splits
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, p := mannWhitney(tc.x, tc.y)
			if u != tc.u || math.Abs(p-tc.p) > 1e-12 {
				t.Fatalf("U %v p %v, want U %v p %v", u, p, tc.u, tc.p)
			}
		})
	}
	if p := normalRankSumP(17, 5, 4, 0); math.Abs(p-0.11134688653314041) > 1e-12 {
		t.Fatalf("asymptotic p %v, want SciPy's 0.11134688653314041", p)
	}
}

// The exact count, ties included, against every split enumerated.
func TestMannWhitneyExactMatchesEnumeration(t *testing.T) {
	for _, tc := range []struct{ x, y []float64 }{
		{[]float64{1, 2, 2, 3, 5}, []float64{2, 3, 3, 4, 6, 7}},
		{[]float64{10, 10, 10, 12}, []float64{9, 10, 11, 11, 13}},
		{[]float64{1.5, 2.5, 2.5}, []float64{2.5, 2.5, 3.5, 4}},
	} {
		_, p := mannWhitney(tc.x, tc.y)
		if want := enumeratedP(tc.x, tc.y); math.Abs(p-want) > 1e-12 {
			t.Errorf("%v against %v: p %v, enumeration %v", tc.x, tc.y, p, want)
		}
	}
}

// enumeratedP tries every way of taking len(x) of the pooled samples as
// x's and counts those whose mid-rank sum is as far from its mean.
func enumeratedP(x, y []float64) float64 {
	pooled := append(append([]float64{}, x...), y...)
	N, n := len(pooled), len(x)
	midRank := func(v float64) float64 {
		below, equal := 0, 0
		for _, w := range pooled {
			if w < v {
				below++
			} else if w == v {
				equal++
			}
		}
		return float64(below) + float64(equal+1)/2
	}
	mean := float64(n*(N+1)) / 2
	sum := func(mask uint) float64 {
		s := 0.0
		for i, v := range pooled {
			if mask&(1<<i) != 0 {
				s += midRank(v)
			}
		}
		return s
	}
	observed := math.Abs(sum(1<<n-1) - mean)
	var hit, all int
	for mask := uint(0); mask < 1<<N; mask++ {
		if bits.OnesCount(mask) != n {
			continue
		}
		all++
		if math.Abs(sum(mask)-mean) >= observed-1e-9 {
			hit++
		}
	}
	return float64(hit) / float64(all)
}

// Past the exact limit the normal approximation takes over, and agrees.
func TestMannWhitneyLargeSamples(t *testing.T) {
	var x, y []float64
	for i := range 60 {
		x = append(x, float64(i))
		y = append(y, float64(i)+6)
	}
	u, p := mannWhitney(x, y)
	// x's i beats the i-6 values of y below it and ties one: U = Σ (k+½)
	// for k < 54.
	if u != 1458 {
		t.Fatalf("U %v, want 1458", u)
	}
	// 54 pairs of ties: variance 300·(121 − 324/(120·119)); z = (1800 −
	// 1458 − ½)/√variance = 1.79258; p = erfc(z/√2).
	if math.Abs(p-0.07304039035575541) > 1e-12 {
		t.Fatalf("p %v, want 0.07304039035575541", p)
	}
}

func TestLeastMannWhitneyP(t *testing.T) {
	for _, tc := range []struct {
		n, m int
		p    float64
	}{{3, 3, 0.1}, {4, 4, 2.0 / 70}, {5, 5, 2.0 / 252}, {1, 1, 1}} {
		if p := leastMannWhitneyP(tc.n, tc.m); math.Abs(p-tc.p) > 1e-12 {
			t.Errorf("%d and %d samples: %v, want %v", tc.n, tc.m, p, tc.p)
		}
	}
}
