// Package lockd_test checks what belongs to the repository as a whole
// rather than to one package: that its documents stand on their own, and
// that the release and deployment files (Makefile's dist, Dockerfile,
// deploy/) build and say what the binaries accept.
package lockd_test

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoFiles are the files of the repository: git's tracked files, or,
// outside a git checkout (a module download), every file present.
func repoFiles(t *testing.T) []string {
	t.Helper()
	if out, err := exec.Command("git", "ls-files", "-z").Output(); err == nil {
		var files []string
		for _, f := range strings.Split(string(out), "\x00") {
			if f == "" {
				continue
			}
			// A file deleted in the work tree but not yet in the index.
			if _, err := os.Stat(f); err == nil {
				files = append(files, f)
			}
		}
		return files
	}
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == ".git" || path == "bin" || path == "dist") {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestNoFileReachesOutsideTheRepository: the protocol is documented in
// docs/protocol.md; nothing may send a reader to a directory beside the
// checkout, which a clone does not have.
func TestNoFileReachesOutsideTheRepository(t *testing.T) {
	// Spelled in two parts so that this file does not mention them.
	forbidden := []string{"../" + "shared", "/work/" + "shared"}
	for _, file := range repoFiles(t) {
		content, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range bytes.Split(content, []byte("\n")) {
			for _, f := range forbidden {
				if bytes.Contains(line, []byte(f)) {
					t.Errorf("%s:%d mentions %s; point at docs/protocol.md instead", file, i+1, f)
				}
			}
		}
	}
}

// TestMarkdownLinksResolve: every relative link of every Markdown file
// names a file of the repository.
func TestMarkdownLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)
	files := repoFiles(t)
	for _, file := range files {
		if !strings.HasSuffix(file, ".md") {
			continue
		}
		content, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(content), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path := filepath.Join(filepath.Dir(file), target)
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", file, target)
			}
		}
	}
}

// TestNoBuiltBinaryIsTracked: compiled programs (ELF, Mach-O, PE) are
// built, never committed; .gitignore keeps go build's outputs out.
func TestNoBuiltBinaryIsTracked(t *testing.T) {
	magics := [][]byte{{0x7f, 'E', 'L', 'F'}, {0xcf, 0xfa, 0xed, 0xfe}, {0xfe, 0xed, 0xfa, 0xcf}, {'M', 'Z'}}
	for _, file := range repoFiles(t) {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 4)
		n, _ := io.ReadFull(f, head)
		f.Close()
		for _, magic := range magics {
			if bytes.HasPrefix(head[:n], magic) {
				t.Errorf("%s is a compiled program: remove it (git rm) and ignore it in .gitignore", file)
			}
		}
	}
	for _, built := range []string{"bin/lockd", "cmd/lockctl/lockctl", "cmd/lockd/lockd", "lockd", "examples/elect/elect"} {
		if err := exec.Command("git", "check-ignore", "-q", built).Run(); err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) && exit.ExitCode() == 1 {
				t.Errorf(".gitignore does not ignore %s, where go build or make build writes a binary", built)
			}
		}
	}
}
