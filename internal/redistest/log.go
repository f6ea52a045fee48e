package redistest

import (
	"strings"
	"sync"
)

// maxLogBytes is how much of a server's output a tailBuffer keeps.
const maxLogBytes = 64 << 10

// tailBuffer keeps the last maxLogBytes bytes written to it. It is safe for
// concurrent use (os/exec copies stdout and stderr from two goroutines).
type tailBuffer struct {
	mu    sync.Mutex
	buf   []byte
	total int64 // bytes ever written
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - maxLogBytes; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	b.total += int64(len(p))
	return len(p), nil
}

// written returns how many bytes were ever written, a mark for since.
func (b *tailBuffer) written() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// since returns what was written after mark, as far as it is still kept.
func (b *tailBuffer) since(mark int64) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.total - mark
	if n > int64(len(b.buf)) {
		n = int64(len(b.buf))
	}
	if n < 0 {
		n = 0
	}
	return string(b.buf[int64(len(b.buf))-n:])
}

// lastLines returns the last n lines kept.
func (b *tailBuffer) lastLines(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return lastLines(string(b.buf), n)
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
