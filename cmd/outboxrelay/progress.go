package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress draws a progress bar on stderr when it is a terminal, and
// nothing otherwise (a log file or a pipe gets no carriage returns).
// Safe for concurrent use.
type progress struct {
	w     io.Writer // nil: not a terminal
	label string
	total int64
	mu    sync.Mutex
	last  time.Time
	n     int64
}

func newProgress(w io.Writer, label string, total int64) *progress {
	p := &progress{label: label, total: total}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.w = w
		}
	}
	return p
}

func (p *progress) set(n int64) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n = n
	if now := time.Now(); now.Sub(p.last) >= 100*time.Millisecond {
		p.last = now
		p.draw()
	}
}

func (p *progress) draw() {
	if p.total <= 0 {
		fmt.Fprintf(p.w, "\r%s: %d", p.label, p.n)
		return
	}
	const width = 30
	filled := int(min(p.n, p.total) * width / p.total)
	fmt.Fprintf(p.w, "\r%s [%s%s] %d/%d %3d%%", p.label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled),
		p.n, p.total, min(p.n, p.total)*100/p.total)
}

// done draws the final state and ends the line.
func (p *progress) done() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draw()
	fmt.Fprintln(p.w)
}

// clear erases the bar's line, for output that follows on the same screen.
// It does nothing once the bar is cleared or when nothing was drawn.
func (p *progress) clear() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.last.IsZero() {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.last = time.Time{}
	}
}
