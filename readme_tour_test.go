package lockd_test

import (
	"bytes"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/server"
)

// tourFrames are the frames the README's tour sends with printf, in
// order, with printf's escapes decoded.
func tourFrames(t *testing.T) [][]byte {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var frames [][]byte
	for _, m := range regexp.MustCompile(`(?m)^printf '([^']*)' \| nc `).FindAllStringSubmatch(string(readme), -1) {
		frames = append(frames, printfBytes(t, m[1]))
	}
	return frames
}

// printfBytes decodes the escapes the tour uses: \n, \\ and octal \NNN.
func printfBytes(t *testing.T, format string) []byte {
	t.Helper()
	var out []byte
	for i := 0; i < len(format); i++ {
		if format[i] != '\\' {
			out = append(out, format[i])
			continue
		}
		i++
		switch {
		case i == len(format):
			t.Fatalf("printf %q ends in a backslash", format)
		case format[i] == 'n':
			out = append(out, '\n')
		case format[i] == '\\':
			out = append(out, '\\')
		case format[i] >= '0' && format[i] <= '7':
			j := i
			for j < len(format) && j < i+3 && format[j] >= '0' && format[j] <= '7' {
				j++
			}
			v, _ := strconv.ParseUint(format[i:j], 8, 8)
			out = append(out, byte(v))
			i = j - 1
		default:
			t.Fatalf("printf %q: escape \\%c is not one the tour uses", format, format[i])
		}
	}
	return out
}

// TestREADMETour plays the tour's frames against a server, one
// connection each as nc makes them, and checks the answers the README
// describes: granted with token 1, then TIMEOUT while the first grant is
// held, RELEASED with token 1, then granted again with token 2.
func TestREADMETour(t *testing.T) {
	frames := tourFrames(t)
	if len(frames) != 2 {
		t.Fatalf("the tour has %d printf frames, want the ACQUIRE and the RELEASE", len(frames))
	}
	acquire, release := frames[0], frames[1]
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	type answer struct {
		op    byte
		owner uint64
		token uint64
	}
	for i, step := range []struct {
		send []byte
		want answer
	}{
		{acquire, answer{codec.OpAcquired, 1, 1}},
		{acquire, answer{codec.OpTimeout, 1, 0}},
		{release, answer{codec.OpReleased, 2, 0}},
		{acquire, answer{codec.OpAcquired, 1, 2}},
	} {
		conn, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(step.send); err != nil {
			t.Fatal(err)
		}
		reader := codec.NewResponseReader(conn, 512)
		var greeting, resp codec.Response
		if err := reader.Next(&greeting); err != nil || greeting.Op != codec.OpGreeting || greeting.Flags != codec.GreetingAbandon {
			t.Fatalf("step %d: greeting %+v, %v", i+1, greeting, err)
		}
		if err := reader.Next(&resp); err != nil && err != io.EOF {
			t.Fatalf("step %d: %v", i+1, err)
		}
		if got := (answer{resp.Op, resp.Owner, resp.Token}); got != step.want {
			t.Errorf("step %d: answer %q owner %d token %d, want %q owner %d token %d",
				i+1, got.op, got.owner, got.token, step.want.op, step.want.owner, step.want.token)
		}
		conn.Close()
	}
}

// TestREADMESetUp holds the README's first screen to what a newcomer
// runs: exactly two set-up commands, the build and the server it built
// (so that stopping the process stops lockd, which a `go run` wrapper
// would not pass its signal to), then make test; and make build puts
// lockd where the first command runs it from.
func TestREADMESetUp(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## Set up\n\n```sh\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: no ```sh block right under ## Set up")
	}
	var commands []string
	for _, line := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
		command, _, _ := strings.Cut(line, "#")
		commands = append(commands, strings.TrimSpace(command))
	}
	if want := []string{"make build && bin/lockd serve", "make test"}; !slices.Equal(commands, want) {
		t.Fatalf("the set-up commands are %q, want %q", commands, want)
	}
	out, err := exec.Command("make", "-n", "build").Output()
	if err != nil {
		t.Fatalf("make -n build: %v", err)
	}
	if !regexp.MustCompile(`go build .*-o bin/ \./cmd/\.\.\.`).Match(out) {
		t.Fatalf("make build does not build ./cmd/... into bin/:\n%s", out)
	}
	orphaning := []byte("go run ./cmd/lockd" + " serve") // in two parts, so that this file does not say it
	for _, file := range repoFiles(t) {
		text, err := os.ReadFile(file)
		if err == nil && bytes.Contains(text, orphaning) {
			t.Errorf("%s tells to start the server with go run, whose process does not pass SIGTERM on to lockd", file)
		}
	}
}

// TestREADMELayout: the layout table has a row for every top-level
// directory of the repository, and the deploy/ row names every
// subdirectory of deploy/.
func TestREADMELayout(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z]+)/` \\| (.*) \\|$").FindAllStringSubmatch(string(readme), -1) {
		rows[m[1]] = m[2]
	}
	subdirs := map[string]bool{}
	for _, file := range repoFiles(t) {
		dir, rest, nested := strings.Cut(file, "/")
		if !nested || strings.HasPrefix(dir, ".") {
			continue
		}
		if _, ok := rows[dir]; !ok {
			t.Errorf("README.md's layout table has no row for %s/ (holding %s)", dir, file)
			rows[dir] = ""
		}
		if sub, _, deeper := strings.Cut(rest, "/"); dir == "deploy" && deeper {
			subdirs[sub] = true
		}
	}
	for sub := range subdirs {
		if !strings.Contains(rows["deploy"], "`"+sub+"/`") {
			t.Errorf("README.md's deploy/ row does not name %s/: %q", sub, rows["deploy"])
		}
	}
}
