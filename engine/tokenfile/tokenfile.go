// Package tokenfile keeps single-mode lockd's token high-water mark in its
// data directory: it is the engine.HighWaterMark behind `lockd serve
// --data-dir` (SPEC §4). It owns that one file: its format (one line whose
// CRC-32C makes a torn or damaged file an error, never a smaller mark), its
// atomic replacement (write a temporary file, fsync it, rename it over the
// mark, fsync the directory) and the lock that keeps a second process off
// the directory. It lives beside the engine, not in it, because the engine
// knows locks and time and no files; and not in server, because the mark
// is the engine's token counter made durable, with nothing of sockets —
// cluster mode keeps its counters in Raft instead and has no use for it.
package tokenfile

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Name is the mark's file name in the data directory.
const Name = "token-mark"

// The file is one line: header, the mark in decimal, sumField, the CRC-32C
// (Castagnoli) of everything before sumField in 8 hex digits, LF.
const (
	header   = "lockd token-mark v1 next="
	sumField = " crc32c="
	// maxSize bounds what is read: a valid line is far shorter.
	maxSize = 128
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// File is an open data directory and the mark recorded in it. Reserve is
// not safe for concurrent use; the engine calls it from one goroutine.
type File struct {
	dir  *os.File // held open for the lock and for fsyncs after a rename
	path string
	mark uint64
}

// Open locks dir, creating it if it does not exist, and reads the mark
// recorded there; a directory without one is a first start (mark 0). A
// mark that cannot be read or is damaged is an error naming the file and
// the way out: lockd must not start without knowing which tokens it
// issued before.
func Open(dir string) (*File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("token mark: cannot create the data dir: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("token mark: cannot open the data dir: %w", err)
	}
	if err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		d.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("token mark: the data dir %s is in use by another lockd process; give each process its own --data-dir", dir)
		}
		return nil, fmt.Errorf("token mark: cannot lock the data dir %s: %w", dir, err)
	}
	f := &File{dir: d, path: filepath.Join(dir, Name)}
	if f.mark, err = read(f.path); err != nil {
		d.Close()
		return nil, err
	}
	return f, nil
}

// Path is the mark's file.
func (f *File) Path() string { return f.path }

// Reserved is the mark recorded last: every token issued before is below
// it. 0 on a first start.
func (f *File) Reserved() uint64 { return f.mark }

// Reserve records mark in place of the current one, durably, before it
// returns. A crash at any point leaves the old mark or the new one.
func (f *File) Reserve(mark uint64) error {
	if mark <= f.mark {
		return fmt.Errorf("token mark: %d is not above the recorded %d", mark, f.mark)
	}
	tmp := f.path + ".tmp"
	if err := writeSynced(tmp, format(mark)); err != nil {
		return f.unwritable(err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return f.unwritable(err)
	}
	if err := f.dir.Sync(); err != nil {
		return f.unwritable(err)
	}
	f.mark = mark
	return nil
}

// Close releases the data directory for another process.
func (f *File) Close() error { return f.dir.Close() }

func (f *File) unwritable(err error) error {
	return fmt.Errorf("token mark: cannot record the mark in %s: %w (the data dir must be writable by lockd; --data-dir '' runs without a mark, and tokens then start again at --first-token on every start)", f.path, err)
}

func writeSynced(path string, data []byte) error {
	w, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	if err == nil {
		err = w.Sync()
	}
	if closeErr := w.Close(); err == nil {
		err = closeErr
	}
	return err
}

func read(path string) (uint64, error) {
	r, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, unreadable(path, err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, maxSize+1))
	if err != nil {
		return 0, unreadable(path, err)
	}
	mark, err := parse(data)
	if err != nil {
		return 0, fmt.Errorf("token mark: %s is damaged (%w), so the fencing tokens issued before are unknown and lockd will not start: "+
			"restore the file from a backup, or move it away and start once with --first-token above every token issued "+
			"before (above the old process's last lockd_token_highest_issued)", path, err)
	}
	return mark, nil
}

func unreadable(path string, err error) error {
	return fmt.Errorf("token mark: cannot read %s: %w (lockd will not start without it: fix the file's permissions or the disk, and start again)", path, err)
}

func format(mark uint64) []byte {
	line := strconv.AppendUint([]byte(header), mark, 10)
	line = append(line, sumField...)
	line = fmt.Appendf(line, "%08x\n", crc32.Checksum(line[:len(line)-len(sumField)], castagnoli))
	return line
}

// errTorn is a file cut short: a write that never completed.
var errTorn = errors.New("torn or truncated")

func parse(data []byte) (uint64, error) {
	if len(data) > maxSize {
		return 0, errors.New("longer than a mark")
	}
	body, sum, ok := bytes.Cut(data, []byte(sumField))
	if !ok || len(sum) != 9 || sum[8] != '\n' {
		return 0, errTorn
	}
	want, err := strconv.ParseUint(string(sum[:8]), 16, 32)
	if err != nil {
		return 0, fmt.Errorf("bad checksum field %q", sum[:8])
	}
	if got := crc32.Checksum(body, castagnoli); uint64(got) != want {
		return 0, fmt.Errorf("the line sums to %08x, its checksum says %08x", got, want)
	}
	digits, ok := bytes.CutPrefix(body, []byte(header))
	if !ok {
		return 0, fmt.Errorf("not a lockd token mark of a known version: %q", body)
	}
	mark, err := strconv.ParseUint(string(digits), 10, 64)
	if err != nil || mark == 0 {
		return 0, fmt.Errorf("bad mark %q", digits)
	}
	return mark, nil
}
