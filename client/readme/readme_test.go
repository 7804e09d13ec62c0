package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestREADMEShowsThisProgram holds the README's Go block to this
// directory's main.go, byte for byte, so that the program a reader copies
// is the one `go vet ./...` and `go build ./...` compile.
func TestREADMEShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	rest := string(readme)
	for {
		_, after, found := strings.Cut(rest, "\n```go\n")
		if !found {
			break
		}
		block, tail, closed := strings.Cut(after, "\n```\n")
		if !closed {
			t.Fatal("README.md: a ```go block never ends")
		}
		blocks = append(blocks, block+"\n")
		rest = tail
	}
	if len(blocks) != 1 {
		t.Fatalf("README.md has %d Go blocks; the one it should have is client/readme/main.go", len(blocks))
	}
	if blocks[0] != string(program) {
		t.Fatalf("README.md's Go block differs from client/readme/main.go; copy the file into the README:\n%s", firstDifference(blocks[0], string(program)))
	}
}

// firstDifference shows the first line where the README and the program
// part.
func firstDifference(readme, program string) string {
	r, p := strings.Split(readme, "\n"), strings.Split(program, "\n")
	for i := range min(len(r), len(p)) {
		if r[i] != p[i] {
			return "line " + strconv.Itoa(i+1) + ":\n  README:  " + r[i] + "\n  main.go: " + p[i]
		}
	}
	return "one is a prefix of the other"
}
