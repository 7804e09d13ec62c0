package bench

import (
	"math"
	"slices"
)

// exactMannWhitneyLimit is the most pooled samples whose p-value is
// counted exactly; past it the normal approximation is close and the
// count's table grows as the cube of the samples.
const exactMannWhitneyLimit = 100

// mannWhitney runs the two-sided Mann-Whitney U test (Wilcoxon rank sum)
// of x against y: u is x's U statistic, the number of pairs (xi, yj) with
// xi > yj, a tie counting one half; p the probability, were both drawn from
// one distribution, of a U at least as far from its mean n·m/2. Ties get
// mid-ranks. Up to exactMannWhitneyLimit samples p is exact: the share of
// all the ways of splitting the pooled ranks (ties as they are) into groups
// of the two sizes whose rank sum is as far out. Past it p is the normal
// approximation with the tie correction and a continuity correction. It
// assumes nothing about the shape of either distribution, which is why a
// benchmark's samples, skewed by stalls, are compared with it.
func mannWhitney(x, y []float64) (u, p float64) {
	n, m := len(x), len(y)
	if n == 0 || m == 0 {
		return 0, 1
	}
	ranks2, tieTerm := doubledRanks(x, y)
	// rankSum2 is twice the rank sum of x: an integer even with half ranks.
	rankSum2 := 0
	for _, r := range ranks2[:n] {
		rankSum2 += r
	}
	u = float64(rankSum2)/2 - float64(n*(n+1))/2
	if n+m <= exactMannWhitneyLimit {
		return u, exactRankSumP(ranks2, n, rankSum2)
	}
	return u, normalRankSumP(u, n, m, tieTerm)
}

// doubledRanks gives twice the mid-rank of every sample of x then y, in
// that order, and Σ(t³−t) over the groups of t tied samples.
func doubledRanks(x, y []float64) (ranks2 []int, tieTerm float64) {
	type sample struct {
		v float64
		i int
	}
	pooled := make([]sample, 0, len(x)+len(y))
	for i, v := range x {
		pooled = append(pooled, sample{v, i})
	}
	for i, v := range y {
		pooled = append(pooled, sample{v, len(x) + i})
	}
	slices.SortFunc(pooled, func(a, b sample) int {
		switch {
		case a.v < b.v:
			return -1
		case a.v > b.v:
			return 1
		}
		return 0
	})
	ranks2 = make([]int, len(pooled))
	for lo := 0; lo < len(pooled); {
		hi := lo + 1
		for hi < len(pooled) && pooled[hi].v == pooled[lo].v {
			hi++
		}
		// Ranks lo+1 … hi share their mean, (lo+1+hi)/2.
		for _, s := range pooled[lo:hi] {
			ranks2[s.i] = lo + 1 + hi
		}
		if t := float64(hi - lo); t > 1 {
			tieTerm += t*t*t - t
		}
		lo = hi
	}
	return ranks2, tieTerm
}

// exactRankSumP counts, over every choice of n of the pooled doubled ranks,
// those whose sum is at least as far from the mean as observed, and
// returns their share. ways[k][s] is how many choices of k ranks among
// those seen so far sum to s.
func exactRankSumP(ranks2 []int, n, observed int) float64 {
	total := 0
	for _, r := range ranks2 {
		total += r
	}
	ways := make([][]float64, n+1)
	for k := range ways {
		ways[k] = make([]float64, total+1)
	}
	ways[0][0] = 1
	for _, r := range ranks2 {
		for k := n; k >= 1; k-- {
			for s := total; s >= r; s-- {
				ways[k][s] += ways[k-1][s-r]
			}
		}
	}
	// The mean of n doubled ranks is n·total/N; compare distances times N
	// to stay in integers.
	N := len(ranks2)
	far := abs(observed*N - n*total)
	var hit, all float64
	for s, w := range ways[n] {
		all += w
		if abs(s*N-n*total) >= far {
			hit += w
		}
	}
	return min(1, hit/all)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// normalRankSumP is the two-sided p-value of U under the normal
// approximation, its variance corrected for ties and its distance from the
// mean for continuity.
func normalRankSumP(u float64, n, m int, tieTerm float64) float64 {
	nf, mf := float64(n), float64(m)
	N := nf + mf
	mean := nf * mf / 2
	variance := nf * mf / 12 * ((N + 1) - tieTerm/(N*(N-1)))
	if variance <= 0 {
		return 1 // every sample tied
	}
	z := (math.Abs(u-mean) - 0.5) / math.Sqrt(variance)
	if z < 0 {
		return 1
	}
	return math.Erfc(z / math.Sqrt2)
}

// leastMannWhitneyP is the smallest two-sided p-value the exact test can
// give with n and m samples and no ties: the two most extreme splits of
// the C(n+m, n) equally likely ones. Below alpha no run of that size can
// ever be told from noise.
func leastMannWhitneyP(n, m int) float64 {
	ways := 1.0
	for i := 1; i <= n; i++ {
		ways = ways * float64(m+i) / float64(i)
	}
	return min(1, 2/ways)
}
