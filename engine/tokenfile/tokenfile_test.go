package tokenfile

import (
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func open(t *testing.T, dir string) *File {
	t.Helper()
	f, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// wantError checks that err exists and says every one of parts.
func wantError(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one saying %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not say %q", err, p)
		}
	}
}

func TestFirstStartCreatesTheDirAndMarksSurviveReopening(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "lockd.data")
	f := open(t, dir)
	if f.Reserved() != 0 || f.Path() != filepath.Join(dir, Name) {
		t.Fatalf("first start: mark %d at %s", f.Reserved(), f.Path())
	}
	for _, mark := range []uint64{1 << 20, 1<<21 + 1, 1<<64 - 1} {
		if err := f.Reserve(mark); err != nil {
			t.Fatal(err)
		}
		if f.Reserved() != mark {
			t.Fatalf("Reserved %d after Reserve(%d)", f.Reserved(), mark)
		}
	}
	wantError(t, f.Reserve(5), "not above")
	f.Close()
	if again := open(t, dir); again.Reserved() != 1<<64-1 {
		t.Fatalf("reopened: mark %d", again.Reserved())
	}
	if _, err := os.Stat(filepath.Join(dir, Name+".tmp")); !os.IsNotExist(err) {
		t.Fatalf("the temporary file was left behind: %v", err)
	}
}

// Two processes on one data dir could each record a mark below the other's
// tokens, so the second one is refused while the first holds the dir.
func TestDataDirServesOneProcessAtATime(t *testing.T) {
	dir := t.TempDir()
	first, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir)
	wantError(t, err, dir, "in use by another lockd process")
	first.Close()
	open(t, dir)
}

// writeMark puts a mark file in dir as a previous process left it.
func writeMark(t *testing.T, dir string, content []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, Name), content, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A mark cut short anywhere, as by a write that never completed, stops the
// start with the file and the way out: never a silent reset to a smaller
// mark.
func TestTornMarkStopsTheStart(t *testing.T) {
	dir := t.TempDir()
	whole := format(123456789)
	for n := range len(whole) {
		writeMark(t, dir, whole[:n])
		_, err := Open(dir)
		wantError(t, err, filepath.Join(dir, Name), "damaged", "restore the file", "--first-token")
	}
	writeMark(t, dir, whole)
	if f := open(t, dir); f.Reserved() != 123456789 {
		t.Fatalf("the whole line reads as %d", f.Reserved())
	}
}

func TestDamagedMarkStopsTheStart(t *testing.T) {
	whole := string(format(123456789))
	otherSum := []byte(whole)
	if last := len(otherSum) - 2; otherSum[last] == '0' {
		otherSum[last] = '1'
	} else {
		otherSum[last] = '0'
	}
	newer := "lockd token-mark v2 next=5"
	for name, content := range map[string]string{
		"a digit changed":      strings.Replace(whole, "123", "923", 1),
		"the checksum changed": string(otherSum),
		"a newer format":       fmt.Sprintf("%s crc32c=%08x\n", newer, crc32.Checksum([]byte(newer), castagnoli)),
		"garbage":              "\x00\x01\x02 not a mark\n",
		"zero":                 string(format(0)),
		"too long":             strings.Repeat("9", 200) + "\n",
		"twice":                whole + whole,
		"an empty line":        "\n",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeMark(t, dir, []byte(content))
			_, err := Open(dir)
			wantError(t, err, filepath.Join(dir, Name), "damaged", "--first-token")
		})
	}
}

// A crash while the next mark was being written leaves the temporary file
// torn and the mark itself whole: the start goes on from that mark, which
// was recorded before any token of its block was issued.
func TestTornTemporaryFileLeavesTheMark(t *testing.T) {
	dir := t.TempDir()
	writeMark(t, dir, format(1000))
	if err := os.WriteFile(filepath.Join(dir, Name+".tmp"), format(2000)[:9], 0o644); err != nil {
		t.Fatal(err)
	}
	f := open(t, dir)
	if f.Reserved() != 1000 {
		t.Fatalf("mark %d, want the last whole one, 1000", f.Reserved())
	}
	if err := f.Reserve(3000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if again := open(t, dir); again.Reserved() != 3000 {
		t.Fatalf("reopened: mark %d", again.Reserved())
	}
}

func TestUnreadableMarkStopsTheStart(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, Name), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir)
	wantError(t, err, filepath.Join(dir, Name), "cannot read", "will not start")
}

// readOnly makes dir read-only for this process: a read-only bind mount
// when it runs as root (whom permissions do not stop), its mode otherwise.
func readOnly(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(dir, 0o755) })
		return
	}
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	if err := syscall.Mount("", dir, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
}

func TestReadOnlyDataDir(t *testing.T) {
	dir := t.TempDir()
	writeMark(t, dir, format(1000))
	readOnly(t, dir)

	_, err := Open(filepath.Join(dir, "lockd.data"))
	wantError(t, err, filepath.Join(dir, "lockd.data"), "cannot create the data dir")

	f := open(t, dir)
	if f.Reserved() != 1000 {
		t.Fatalf("mark %d", f.Reserved())
	}
	wantError(t, f.Reserve(2000), filepath.Join(dir, Name), "cannot record", "must be writable")
	if f.Reserved() != 1000 {
		t.Fatalf("a failed Reserve moved the mark to %d", f.Reserved())
	}
}
