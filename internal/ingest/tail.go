package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// TailSettings configure a Tailer. Path is required.
type TailSettings struct {
	// Path is the file to follow.
	Path string
	// OffsetFile keeps the file's identity and the offset of the last line
	// handled, so that a restart resumes there without sending a line
	// twice. Empty: no offset is kept.
	OffsetFile string
	// FromStart reads a file that has no saved offset from its start. If
	// false, from its end (lines written before the first start are old
	// news).
	FromStart bool
	// Poll is how often the file is checked for new lines, rotation and
	// truncation. If zero, 250ms.
	Poll time.Duration
	// MaxLine bounds a line; a longer one is dropped (OnLongLine). If
	// zero, 64 KiB.
	MaxLine int
	// OnRotate, OnTruncate and OnLongLine, when set, are called when the
	// path is replaced by a new file, when the file shrinks under the
	// offset (copytruncate), and when a line is dropped for its length.
	OnRotate, OnTruncate, OnLongLine func()
}

// Tailer follows a log file as `tail -F` does: new lines as they are
// written, a rotated file read to its end before the new one is opened
// (create-style rotation, logrotate's default), a truncated file read again
// from its start (copytruncate). Only whole lines are handed on; the offset
// after the last handled line is saved after every batch.
type Tailer struct {
	s TailSettings
}

// offsetState is the content of the offset file.
type offsetState struct {
	Path   string `json:"path"`
	Dev    uint64 `json:"dev"`
	Inode  uint64 `json:"inode"`
	Offset int64  `json:"offset"`
}

// NewTailer returns a Tailer of s.
func NewTailer(s TailSettings) *Tailer {
	if s.Poll <= 0 {
		s.Poll = 250 * time.Millisecond
	}
	if s.MaxLine <= 0 {
		s.MaxLine = 64 << 10
	}
	return &Tailer{s: s}
}

func fileID(fi os.FileInfo) (dev, ino uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), uint64(st.Ino)
	}
	return 0, 0
}

func (t *Tailer) loadOffset() (offsetState, bool) {
	if t.s.OffsetFile == "" {
		return offsetState{}, false
	}
	data, err := os.ReadFile(t.s.OffsetFile)
	if err != nil {
		return offsetState{}, false
	}
	var st offsetState
	if json.Unmarshal(data, &st) != nil || st.Offset < 0 {
		return offsetState{}, false
	}
	return st, true
}

// PrepareOffsetFile makes sure the offset file at path can be written:
// it creates its directory (a default data directory such as ./data need
// not exist yet) and writes and removes its temporary file, so that a
// directory that cannot be created or written is an error at start that
// names it, not a failure after the first batch. An empty path is no
// offset file and always fine.
func PrepareOffsetFile(path string) error {
	if path == "" {
		return nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("ingest: offset file %s: cannot create its directory: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, nil, 0o644); err != nil {
		return fmt.Errorf("ingest: offset file %s: cannot write in %s: %w", path, dir, err)
	}
	os.Remove(tmp)
	return nil
}

// saveOffset writes the offset file atomically (a temporary file renamed
// over it).
func (t *Tailer) saveOffset(st offsetState) error {
	if t.s.OffsetFile == "" {
		return nil
	}
	data, _ := json.Marshal(st)
	tmp := t.s.OffsetFile + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("ingest: offset file: %w", err)
	}
	if err := os.Rename(tmp, t.s.OffsetFile); err != nil {
		return fmt.Errorf("ingest: offset file: %w", err)
	}
	return nil
}

// follower is the open file and what was read of it.
type follower struct {
	f       *os.File
	dev     uint64
	ino     uint64
	offset  int64  // of the end of the last handled line
	partial []byte // bytes after offset not yet ending in a newline
	skip    bool   // dropping the rest of an overlong line
}

// Run follows the file until ctx ends, calling handle with the complete
// lines of each read (without their newlines). When handle fails, the
// lines are offered again at the next poll and the offset is not moved.
// It returns nil when ctx ends; an error only when the offset file cannot
// be written (checked first, PrepareOffsetFile).
func (t *Tailer) Run(ctx context.Context, handle func(lines [][]byte) error) error {
	if err := PrepareOffsetFile(t.s.OffsetFile); err != nil {
		return err
	}
	var cur *follower
	defer func() {
		if cur != nil {
			cur.f.Close()
		}
	}()
	saved, hasSaved := t.loadOffset()
	tick := time.NewTicker(t.s.Poll)
	defer tick.Stop()
	for {
		if cur == nil {
			cur = t.open(saved, hasSaved)
			hasSaved = false
		}
		if cur != nil {
			next, err := t.poll(cur, handle)
			if err != nil {
				return err
			}
			cur = next
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// open opens Path (nil when it does not exist yet) at the saved offset
// when the saved state names this file; when it names another one, the
// rotated file (Path.1) is read from the saved offset first if it is that
// file.
func (t *Tailer) open(saved offsetState, hasSaved bool) *follower {
	f, err := os.Open(t.s.Path)
	if err != nil {
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil
	}
	dev, ino := fileID(fi)
	fl := &follower{f: f, dev: dev, ino: ino}
	switch {
	case hasSaved && saved.Dev == dev && saved.Inode == ino:
		if saved.Offset <= fi.Size() {
			fl.offset = saved.Offset
		} // else truncated while we were away: from the start
	case hasSaved:
		// Rotated while we were away: finish the old file when it is
		// still next to the new one, then read the new one from its start.
		if old, err := os.Open(t.s.Path + ".1"); err == nil {
			if ofi, err := old.Stat(); err == nil {
				if d, i := fileID(ofi); d == saved.Dev && i == saved.Inode && saved.Offset <= ofi.Size() {
					return &follower{f: old, dev: d, ino: i, offset: saved.Offset}
				}
			}
			old.Close()
		}
	case !t.s.FromStart:
		fl.offset = fi.Size()
	}
	return fl
}

// poll reads what was appended to cur and hands the whole lines on; it
// returns the follower to use next (a new one after rotation, nil when the
// path is gone).
func (t *Tailer) poll(cur *follower, handle func(lines [][]byte) error) (*follower, error) {
	fi, err := cur.f.Stat()
	if err == nil && fi.Size() < cur.offset+int64(len(cur.partial)) {
		// Truncated under us (copytruncate): start again.
		cur.offset, cur.partial, cur.skip = 0, nil, false
		if t.s.OnTruncate != nil {
			t.s.OnTruncate()
		}
	}
	if err := t.readLines(cur, handle); err != nil {
		return cur, err
	}
	// Rotated: the path names another file (or none). The old one has
	// been read to its end above; switch to the new one from its start.
	pfi, err := os.Stat(t.s.Path)
	if err != nil {
		return cur, nil // gone for now: keep the old file until a new one appears
	}
	if dev, ino := fileID(pfi); dev != cur.dev || ino != cur.ino {
		if t.s.OnRotate != nil {
			t.s.OnRotate()
		}
		cur.f.Close()
		next := t.open(offsetState{}, false)
		if next != nil {
			next.offset = 0
			if err := t.saveOffset(offsetState{Path: t.s.Path, Dev: next.dev, Inode: next.ino}); err != nil {
				return next, err
			}
			return next, t.readLines(next, handle)
		}
		return nil, nil
	}
	return cur, nil
}

// readLines reads from cur's offset to the end of the file.
func (t *Tailer) readLines(cur *follower, handle func(lines [][]byte) error) error {
	buf := make([]byte, 256<<10)
	for {
		pos := cur.offset + int64(len(cur.partial))
		n, err := cur.f.ReadAt(buf, pos)
		if n == 0 {
			if err != nil && !errors.Is(err, io.EOF) {
				return nil // transient: try again at the next poll
			}
			return nil
		}
		data := append(cur.partial, buf[:n]...)
		var lines [][]byte
		consumed := 0
		for {
			i := bytes.IndexByte(data[consumed:], '\n')
			if i < 0 {
				break
			}
			line := data[consumed : consumed+i]
			consumed += i + 1
			if cur.skip {
				cur.skip = false
				continue
			}
			if len(line) > t.s.MaxLine {
				if t.s.OnLongLine != nil {
					t.s.OnLongLine()
				}
				continue
			}
			lines = append(lines, bytes.TrimSuffix(line, []byte{'\r'}))
		}
		rest := data[consumed:]
		if len(rest) > t.s.MaxLine {
			// An overlong line still being written: drop what we have and
			// skip to its end.
			if !cur.skip && t.s.OnLongLine != nil {
				t.s.OnLongLine()
			}
			cur.skip = true
			consumed += len(rest)
			rest = nil
		}
		if len(lines) > 0 {
			if err := handle(lines); err != nil {
				return nil // offered again at the next poll
			}
		}
		cur.offset += int64(consumed)
		cur.partial = append([]byte(nil), rest...)
		if consumed > 0 {
			if err := t.saveOffset(offsetState{Path: filepath.Clean(t.s.Path), Dev: cur.dev, Inode: cur.ino, Offset: cur.offset}); err != nil {
				return err
			}
		}
		if n < len(buf) {
			return nil
		}
	}
}
